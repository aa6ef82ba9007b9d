"""Benchmark: tkg's global half (entity resolution, the sharded invalidation steps, fact
relevance, publishing tkg.duckdb) on synthetic Parquet stores of growing size, cold and after
one new quarter, and what 5,000 companies x 40 quarters would cost.

    nice -n 5 python benchmarks/bench_scale.py [--sizes 1000000,5000000,10000000] [--increment-at 5000000]

For every size a store is generated (benchmarks/synthetic.py, `write_scaled_store`). Its
newest quarter is held back; the cold pass runs every global step and every shard of the shard
steps (TKG_SHARDS, `--shards`), then the publish. With `--runner refresh` (the default) a pass
is what one `refresh_and_publish` run does (tkg_assets.batch.refresh_global, in one child: the
global steps in it, a shard step's shards in one worker process per core); with `--runner
steps`, every global step and every shard runs in a process of its own, one after another, which
shows each shard's own time and memory. Per step: wall time, CPU and peak resident memory
(ru_maxrss, and sampled every 0.25 s). At the sizes of `--increment-at` the held-back quarter is
then added and the increment pass runs only what is stale (tkg.build.stages.stale_work): which
shards it touched, and its time against the cold pass. A run that passes the memory guard or the
timeout (`--step-timeout`, for each step) is stopped, and that is the result. `--llm-home` names a data folder built with tkg's LLM path (its `llm_calls`
accounting gives the per-call requests and tokens of the cost estimate); without it the
estimate uses benchmarks/results/llm.json. Results: benchmarks/results/scale.json and a report
on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import synthetic
from bench_resolution_invalidation import (
    _meminfo_gb,
    _rss_kb,
    fit_power_law,
    machine,
    project,
    watch_child,
    write_report,
)

RESULTS = HERE / "results" / "scale.json"
TARGET_COMPANIES, TARGET_QUARTERS = 5_000, 40
ESTIMATE_MODELS = ("gpt-4.1-mini", "gpt-4o-mini")  # priced with tkg.llm.settings.DEFAULT_PRICES
EMBEDDING_MODEL = "text-embedding-3-large"
HELD_BACK = "held_back"  # where a store's newest quarter waits for the increment pass


# ------------------------------------------------------------------------------------------
# In the child: one global step, or one shard of a shard step, or the publish
# ------------------------------------------------------------------------------------------


def _settings(root: Path, shards: int):
    from tkg.settings import Settings

    return Settings.resolve(home=root, backend="offline", embeddings="wordllama", shards=shards)


def _publish_counts(published) -> dict:
    """What a publish did: its rows and size, each raw table's update, its parts' seconds."""
    return {"raw_rows": published.raw_rows, "file_gb": round(published.size_bytes / 2**30, 2), "seconds": published.seconds,
            "raw_tables": published.tables, "in_place": published.in_place}


def _worker_step(step: str, shard: str | None, root: Path, shards: int) -> int:
    from tkg.build import catalog
    from tkg.build.graph import run_warehouse
    from tkg.build.stages import Runtime, run_global

    settings = _settings(root, shards)
    start = time.time()
    if step == "warehouse":
        published = run_warehouse(settings, root / "tkg.duckdb")
        counts = _publish_counts(published)
    elif step == "truth_resolution":
        counts = write_truth_resolution(settings.store())
    else:
        counts = dict(run_global(Runtime.open(settings), catalog.stage(step), shard).counts)
    end = time.time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"step": step, "shard": shard, "seconds": round(end - start, 2), "start": start, "end": end,
                      "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
                      "counts": counts}, default=str))
    return 0


class _StepClock:
    """The steps of a `refresh_global` pass, told apart by its log lines (each stage's first line
    starts with its name): per step its seconds, the CPU of this process and of the worker
    processes that ended in it, and each process's peak resident memory, sampled."""

    def __init__(self) -> None:
        self.steps: dict[str, dict] = {}
        self.current: str | None = None
        self.peaks: dict[int, int] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def _cpu() -> float:
        own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime

    def _sample(self) -> None:
        me = os.getpid()
        while not self.done.wait(0.25):
            pids = [me]
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == me:
                        pids.append(int(stat.parent.name))
                except (OSError, ValueError, IndexError):
                    continue
            with self.lock:
                for pid in pids:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), _rss_kb(pid))

    def start(self, name: str) -> None:
        self.stop()
        with self.lock:
            self.peaks = {}
        self.current = name
        self.steps[name] = {"started": time.perf_counter(), "cpu_started": self._cpu(), "lines": []}

    def stop(self) -> None:
        if self.current is None:
            return
        step = self.steps[self.current]
        with self.lock:
            peaks = dict(self.peaks)
        step.update({"seconds": round(time.perf_counter() - step.pop("started"), 2),
                     "cpu_s": round(self._cpu() - step.pop("cpu_started"), 1),
                     "processes": len(peaks), "peak_rss_gb": round(max(peaks.values(), default=0) / 2**20, 2)})
        self.current = None

    def info(self, message: str) -> None:
        name = message.split(":", 1)[0]
        if name != self.current and name in {stage.name for stage in _global_stages()}:
            self.start(name)
        if self.current:
            self.steps[self.current]["lines"].append(message)

    warning = error = debug = info


def _worker_pass(root: Path, shards: int) -> int:
    """The global half as the `refresh_and_publish` job runs it (tkg_assets.batch.refresh_global:
    global steps in this process, a shard step's stale shards in one worker process per core,
    each worker taking shard after shard), then the publish; one JSON line with every step."""
    from tkg.build.graph import run_warehouse
    from tkg_assets.batch import RefreshAndPublish, refresh_global

    settings = _settings(root, shards)
    clock = _StepClock()
    start = time.time()
    materialised: Counter = Counter()
    failure = None
    try:
        for event in refresh_global(clock, settings, RefreshAndPublish(), None):
            materialised[event.asset_key.to_user_string()] += 1
        clock.start("warehouse")
        published = run_warehouse(settings, root / "tkg.duckdb")
        clock.steps["warehouse"]["counts"] = _publish_counts(published)
    except Exception as error:  # noqa: BLE001 - the failing step is the result, reported with the steps before it
        failure = f"{clock.current}: {type(error).__name__}: {getattr(error, 'description', None) or error}"
        if clock.current:
            clock.steps[clock.current]["error"] = failure
    clock.stop()
    clock.done.set()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": round(time.time() - start, 2), "steps": clock.steps, "materialised": materialised,
                      "failure": failure, "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2)}, default=str))
    return 0 if failure is None else 1


def write_truth_resolution(store) -> dict:
    """The generator's ground truth as `canonical_entities`, stamped as resolution would stamp
    it: the stand-in that lets invalidation be measured at a size resolution did not finish."""
    import duckdb
    import pyarrow as pa

    from tkg.build import catalog
    from tkg.build.state import consistent_versions, global_inputs, read_state
    from tkg.core import tables
    from tkg.core.versions import Stamp, stamped
    from tkg.resolve.resolution import RESOLUTION_VERSION

    truth = str(store.root / "synthetic" / "truth" / "*.parquet")
    with duckdb.connect() as connection:
        mapping = connection.sql("SELECT entity_id, canonical_id, 'truth' AS method, 1.0 AS score FROM read_parquet($truth)",
                                 params={"truth": truth}).to_arrow_table().cast(tables.ENTITY_RESOLUTION)
        canonical = connection.sql(
            "SELECT canonical_id, min(name) AS name, min(type) AS type, '' AS description, list(DISTINCT name) AS aliases, "
            "count(*) AS mention_count, min(seen_at) AS first_seen, max(seen_at) AS last_seen, NULL AS merged_into, "
            "'synthetic truth' AS source FROM read_parquet($truth) GROUP BY canonical_id", params={"truth": truth}).to_arrow_table()
    canonical = pa.Table.from_arrays([canonical.column(f.name).cast(f.type) for f in tables.CANONICAL_ENTITIES],
                                     schema=tables.CANONICAL_ENTITIES)
    state = read_state(store)
    stamp = Stamp("canonical_entities", RESOLUTION_VERSION,
                  global_inputs(catalog.stage("canonical_entities"), state, consistent_versions(state)))
    store.write(store.global_path("canonical_entities", "entity_resolution"), stamped(mapping, stamp))
    store.write(store.global_path("canonical_entities"), stamped(canonical, stamp))
    return {"mentions": mapping.num_rows, "canonical_entities": canonical.num_rows}


def resolution_sharing(root: Path) -> dict:
    """How many canonical entities (and their mentions) more than one company's calls mention:
    what splitting resolution by company would cut apart."""
    import duckdb

    entities = str(root / "parquet" / "entities" / "company=*" / "quarter=*" / "entities.parquet")
    mapping = str(root / "parquet" / "canonical_entities" / "entity_resolution.parquet")
    with duckdb.connect() as connection:
        row = connection.execute("""
            WITH per_entity AS (
                SELECT r.canonical_id, count(*) AS mentions, count(DISTINCT e.company) AS companies
                FROM read_parquet($entities) AS e JOIN read_parquet($mapping) AS r USING (entity_id)
                GROUP BY r.canonical_id)
            SELECT count(*), count(*) FILTER (WHERE companies > 1), sum(mentions), sum(mentions) FILTER (WHERE companies > 1),
                   max(companies)
            FROM per_entity""", {"entities": entities, "mapping": mapping}).fetchone()
    entities_total, shared, mentions, shared_mentions, widest = row
    return {"canonical_entities": entities_total, "mentioned_by_several_companies": shared,
            "share_of_mentions_in_those": round(shared_mentions / mentions, 3) if mentions else None,
            "most_companies_one_entity": widest}


def invalidation_sharing(root: Path, links) -> dict:
    """Where candidate selection's work is: block sizes ((canonical entity, predicate group),
    the unit the sweep works in), the share of the sweep's work (sum of block size squared) in
    blocks that span several companies, and the judge pairs whose two events are one company's."""
    import duckdb
    import polars as pl

    events = str(root / "parquet" / "temporal_events" / "company=*" / "quarter=*" / "temporal_events.parquet")
    judgments = str(root / "parquet" / "invalidated_events" / "invalidation_judgments.parquet")
    with duckdb.connect() as connection:
        company = pl.from_arrow(connection.sql("SELECT event_id, company FROM read_parquet($events)",
                                               params={"events": events}).to_arrow_table())
        # Judge requests a quarter of new calls makes: the primaries of the pairs its events make
        # askable (a pair is askable once its later event exists; older pairs are in the verdict cache).
        pairs, same_company, primaries, requests, events_total = connection.execute("""
            WITH pairs AS (
                SELECT j.primary_event_id, p.company = s.company AS same_company,
                       date_trunc('quarter', greatest(p.created_at, s.created_at)) AS askable
                FROM read_parquet($judgments) AS j
                JOIN read_parquet($events) AS p ON p.event_id = j.primary_event_id
                JOIN read_parquet($events) AS s ON s.event_id = j.secondary_event_id
                WHERE j.cosine IS NOT NULL)
            SELECT count(*), count(*) FILTER (WHERE same_company), count(DISTINCT primary_event_id),
                   (SELECT sum(primaries) FROM (SELECT count(DISTINCT primary_event_id) AS primaries FROM pairs GROUP BY askable)),
                   (SELECT count(*) FROM read_parquet($events))
            FROM pairs""", {"judgments": judgments, "events": events}).fetchone()
    result = {"events": events_total, "judge_pairs": pairs,
              "share_of_pairs_within_one_company": round(same_company / pairs, 3) if pairs else None,
              # one build of the whole graph asks once per primary; a quarter at a time re-asks a
              # primary in every quarter that brings it a new candidate
              "judge_requests_per_1000_events_whole_graph": round(1000 * primaries / events_total, 2),
              "judge_requests_per_1000_new_events": round(1000 * (requests or 0) / events_total, 2)}
    if links is None:
        return result
    blocks = (pl.from_arrow(links).join(company, on="event_id")
              .group_by(["canonical_id", "predicate_group"])
              .agg(pl.col("event_id").n_unique().alias("events"), pl.col("company").n_unique().alias("companies"))
              .filter(pl.col("events") > 1).sort("events", descending=True))
    work = blocks["events"].cast(pl.Float64) ** 2
    result.update({
        "blocks": blocks.height,
        "largest_blocks": blocks.head(5).to_dicts(),
        "share_of_sweep_work_in_blocks_of_several_companies": round(float(work.filter(blocks["companies"] > 1).sum() / work.sum()), 3),
        "share_of_sweep_work_in_largest_1pct_blocks": round(float(work.head(max(1, blocks.height // 100)).sum() / work.sum()), 3),
    })
    return result


def _worker_generate(root: Path, events: int, workers: int) -> int:
    size = synthetic.write_scaled_store(root, events, workers, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps({**vars(size), "rows": dict(size.rows)}))
    return 0


# ------------------------------------------------------------------------------------------
# In the parent: stores, steps, guards
# ------------------------------------------------------------------------------------------


def run_child(arguments: list[str], directory: Path, timeout_s: float, args) -> dict:
    """This script with `arguments` in a watched child: its JSON report, with its sampled peak."""
    directory.mkdir(parents=True, exist_ok=True)
    available = _meminfo_gb("MemAvailable")
    command = [sys.executable, str(Path(__file__).resolve()), *arguments]
    run = watch_child(command, directory, timeout_s, args.memory_guard_gb, args.min_available_gb)
    outcome = {"wall_s": round(run.elapsed_s, 1), "peak_rss_gb_sampled": round(run.peak_rss_kb / 2**20, 2),
               "load_average_after": [round(x, 2) for x in os.getloadavg()], "memory_available_gb_at_start": available}
    if run.stopped or run.returncode != 0:
        return {"status": run.stopped or run.failure, **outcome, "error": run.error_tail}
    report = json.loads((directory / "stdout").read_text().strip().splitlines()[-1])
    return {"status": "ok", **outcome, **report}


def _stale(root: Path, shards: int, stage_name: str) -> list[str]:
    from tkg.build import catalog
    from tkg.build.stages import Runtime, stale_work

    return stale_work(Runtime.open(_settings(root, shards)), catalog.stage(stage_name))


def run_pass(root: Path, label: str, args, log) -> dict:
    return (run_pass_refresh if args.runner == "refresh" else run_pass_steps)(root, label, args, log)


def run_pass_refresh(root: Path, label: str, args, log) -> dict:
    """The pass as one `refresh_and_publish` run does it, in one child (`_worker_pass`)."""
    outcome = run_child(["--worker-pass", "--store", str(root), "--shards", str(args.shards)], args.workdir / f"{label}_refresh",
                        args.step_timeout * (len(_global_stages()) + 1), args)
    if outcome["status"] != "ok":  # a failed step: the child still reported the steps that ran, the failing one last
        lines = (args.workdir / f"{label}_refresh" / "stdout").read_text().strip().splitlines()
        try:
            report = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:  # stopped (memory guard, timeout) before it reported
            report = {}
        outcome = {**outcome, **report, "error": report.get("failure") or outcome.get("error")}
    steps = {}
    for name, step in (outcome.get("steps") or {}).items():
        steps[name] = {"status": "ok" if "error" not in step else "failed", "runs": 1, "wall_s": step["seconds"], "cpu_s": step["cpu_s"],
                       "processes": step["processes"], "peak_rss_gb": step["peak_rss_gb"], "lines": step["lines"],
                       **({"counts": step["counts"]} if "counts" in step else {})}
        log(f"  {label} {name}: {step['seconds']}s, {step['cpu_s']} CPU-s, {step['processes']} process(es), "
            f"peak {step['peak_rss_gb']} GB; {' / '.join(step['lines'])[:160]}")
    if outcome["status"] != "ok":
        log(f"  {label}: {outcome['status']} {outcome.get('error', '')}")
    return {"status": outcome["status"], "runner": "refresh", "wall_s": outcome.get("seconds", outcome["wall_s"]),
            "process_s": outcome["wall_s"], "cpu_s": round(sum(step["cpu_s"] for step in steps.values()), 1),
            "peak_rss_gb": max((step["peak_rss_gb"] for step in steps.values()), default=outcome["peak_rss_gb_sampled"]),
            "steps": steps, **({"error": outcome["error"]} if "error" in outcome else {})}


def run_pass_steps(root: Path, label: str, args, log) -> dict:
    """Every stale global step and shard, then the publish, each in a child; per step: runs, wall
    time (summed), the biggest process, counts (summed); the pass stops at the first failure."""
    from tkg.build import catalog

    steps: dict[str, dict] = {}
    started = time.perf_counter()
    for stage in [*catalog.GLOBAL, None]:
        name = stage.name if stage else "warehouse"
        planned = time.perf_counter()
        work = _stale(root, args.shards, name) if stage else ["*"]
        plan_s = time.perf_counter() - planned
        step = {"status": "ok", "runs": 0, "of": args.shards if stage is not None and stage.sharded else 1,
                "wall_s": 0.0, "process_s": 0.0, "cpu_s": 0.0, "plan_s": round(plan_s, 2), "peak_rss_gb": 0.0, "counts": Counter(), "shards": {}}
        for shard in work:
            arguments = ["--worker-step", name, "--store", str(root), "--shards", str(args.shards)]
            if shard != "*":
                arguments += ["--shard", shard]
            outcome = run_child(arguments, args.workdir / f"{label}_{name}_{shard.strip('*') or 'all'}", args.step_timeout, args)
            step["runs"] += 1
            # the step's own time (a child's start-up, imports included, is process_s)
            step["wall_s"] = round(step["wall_s"] + outcome.get("seconds", outcome["wall_s"]), 1)
            step["process_s"] = round(step["process_s"] + outcome["wall_s"], 1)
            step["cpu_s"] = round(step["cpu_s"] + (outcome.get("cpu_s") or 0), 1)
            peak = max(outcome.get("peak_rss_gb") or 0, outcome["peak_rss_gb_sampled"])
            step["peak_rss_gb"] = max(step["peak_rss_gb"], peak)
            step["counts"].update(outcome.get("counts") or {})
            if shard != "*":
                step["shards"][shard] = {"wall_s": outcome.get("seconds"), "process_s": outcome["wall_s"],
                                         "cpu_s": outcome.get("cpu_s"), "peak_rss_gb": peak}
            if outcome["status"] != "ok":
                step["status"] = f"{'shard ' + shard + ': ' if shard != '*' else ''}{outcome['status']}"
                step["error"] = outcome.get("error")
                break
        steps[name] = step
        log(f"  {label} {name}: {step['status']}, {step['runs']} of {step['of']} run(s), {step['wall_s']}s, "
            f"peak {step['peak_rss_gb']} GB{', ' + step.get('error', '') if step['status'] != 'ok' else ''}")
        if step["status"] != "ok":
            break
    total = round(sum(step["wall_s"] + step["plan_s"] for step in steps.values()), 1)
    return {"status": "ok" if all(s["status"] == "ok" for s in steps.values()) else "failed", "wall_s": total,
            "cpu_s": round(sum(step["cpu_s"] for step in steps.values()), 1),
            "elapsed_s": round(time.perf_counter() - started, 1),
            "peak_rss_gb": max((s["peak_rss_gb"] for s in steps.values()), default=0.0), "steps": steps}


def _newest_quarter(root: Path) -> str:
    return max(path.name for path in (root / "parquet" / "transcripts").glob("company=*/quarter=*"))


def reporting_companies(root: Path, quarter: str, count: int | None) -> set[str] | None:
    """The companies (folder names, `company=X`) whose `quarter` the increment adds: all (None),
    or `count` of them chosen by a hash of the name, so they spread over the generated copies."""
    if count is None:
        return None
    names = sorted(path.parent.name for path in (root / "parquet" / "transcripts").glob(f"company=*/{quarter}"))
    return set(sorted(names, key=lambda name: hashlib.sha256(name.encode()).hexdigest())[:count])


def hold_back(root: Path, quarter: str, companies: int | None = None) -> dict:
    """Move the stage files of `quarter`'s partitions (of every company, or of `companies` of
    them) out of the store (to root/held_back): the new quarter the increment pass adds.
    Returns its partitions and events."""
    import duckdb

    chosen = reporting_companies(root, quarter, companies)
    files = [str(path) for path in sorted((root / "parquet" / "temporal_events").glob(f"company=*/{quarter}/*.parquet"))
             if chosen is None or path.parent.parent.name in chosen]
    events = duckdb.execute("SELECT count(*) FROM read_parquet($files)", {"files": files}).fetchall()[0][0] if files else 0
    total = duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/parquet/temporal_events/company=*/quarter=*/*.parquet')"
                       ).fetchall()[0][0]
    partitions = 0
    for folder in sorted((root / "parquet").glob(f"*/company=*/{quarter}")):
        if chosen is not None and folder.parent.name not in chosen:
            continue
        target = root / HELD_BACK / folder.relative_to(root / "parquet")
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(target)
        partitions += folder.parent.parent.name == "transcripts"
    return {"quarter": quarter.removeprefix("quarter="), "partitions": partitions, "events": events,
            "share_of_events": round(events / total, 4), "companies": len(chosen) if chosen is not None else "all"}


def bring_back(root: Path) -> None:
    for folder in sorted((root / HELD_BACK).glob("*/company=*/quarter=*")):
        target = root / "parquet" / folder.relative_to(root / HELD_BACK)
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(target)
    shutil.rmtree(root / HELD_BACK)


def measure_size(n: int, args, log) -> dict:
    root = args.workdir / f"events_{n}"
    if not (args.reuse and (root / "parquet").exists()):
        shutil.rmtree(root, ignore_errors=True)
        log(f"size {n:,}: generating the store in {root}")
        generation = run_child(["--worker-generate", str(root), "--events", str(n), "--generate-workers", str(args.generate_workers)],
                               args.workdir / f"generate_{n}", args.generate_timeout, args)
        if generation["status"] != "ok":
            log(f"  generation: {generation['status']}")
            return {"events_requested": n, "store": generation}
        (root / "store.json").write_text(json.dumps(generation, default=str))
    else:  # a store of an earlier run, as generated: start again from its partitions alone
        if (root / HELD_BACK).exists():
            bring_back(root)
        for stage_folder in ("_manifest", "_packs", *(s.name for s in _global_stages()), "llm_calls"):
            shutil.rmtree(root / "parquet" / stage_folder, ignore_errors=True)
        (root / "tkg.duckdb").unlink(missing_ok=True)
    generation = json.loads((root / "store.json").read_text())
    row = {"events_requested": n, "store": {k: v for k, v in generation.items() if k != "phases"}, "shards": args.shards}
    log(f"  store: {generation['events']:,} events, {generation['rows']['entities']:,} mentions, {generation['partitions']:,} "
        f"partitions, {generation['bytes_on_disk'] / 2**30:.1f} GB")
    row["held_back"] = hold_back(root, _newest_quarter(root), args.increment_companies)
    log(f"  held back {row['held_back']}")
    row["cold"] = run_pass(root, f"cold_{n}", args, log)
    if n in args.increment_at and row["cold"]["status"] == "ok":
        bring_back(root)
        row["increment"] = run_pass(root, f"increment_{n}", args, log)
        row["increment"]["share_of_cold"] = round(row["increment"]["wall_s"] / row["cold"]["wall_s"], 3)
        row["increment"]["cpu_share_of_cold"] = round(row["increment"]["cpu_s"] / row["cold"]["cpu_s"], 3)
    if row["cold"]["status"] == "ok":
        row["sharing"] = {"resolution": resolution_sharing(root), "invalidation": invalidation_sharing(root, None)}
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return row


def _global_stages():
    from tkg.build import catalog

    return catalog.GLOBAL


# ------------------------------------------------------------------------------------------
# The cost of 5,000 companies x 40 quarters
# ------------------------------------------------------------------------------------------


def per_call_llm(llm_home: Path | None) -> dict:
    """Requests and tokens per call and stage: from the llm_calls accounting of a data folder
    built with tkg's LLM path, or else from benchmarks/results/llm.json (bench_llm.py)."""
    import duckdb

    if llm_home is not None:
        files = sorted(str(p) for p in (llm_home / "parquet" / "llm_calls").rglob("llm_calls.parquet"))
        transcripts = sorted(str(p) for p in (llm_home / "parquet" / "transcripts").rglob("transcripts.parquet"))
        with duckdb.connect() as connection:
            calls = connection.execute("SELECT count(*) FROM read_parquet($f)", {"f": transcripts}).fetchone()[0]
            events, triplets = (connection.execute("SELECT count(*) FROM read_parquet($f)", {
                "f": sorted(str(p) for p in (llm_home / "parquet" / asset).rglob(f"{asset}.parquet"))}).fetchone()[0]
                for asset in ("temporal_events", "triplets"))
            # Snapshots are cumulative per partition and stage: the largest is the total.
            rows = connection.execute("""
                SELECT stage, any_value(model), sum(requests), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens)
                FROM (SELECT stage, company, quarter, arg_max(model, requests) AS model, max(requests) AS requests,
                             max(input_tokens) AS input_tokens, max(cached_input_tokens) AS cached_input_tokens,
                             max(output_tokens) AS output_tokens
                      FROM read_parquet($f, union_by_name = true) GROUP BY ALL)
                GROUP BY stage ORDER BY stage""", {"f": files}).fetchall()
        stages = {stage: {"model": model, "requests": int(r), "input_tokens": int(i), "cached_input_tokens": int(c),
                          "output_tokens": int(o)} for stage, model, r, i, c, o in rows}
        source = f"llm_calls of {llm_home} ({calls} calls, {events} events, {triplets} triplets)"
    else:
        recorded = json.loads((HERE / "results" / "llm.json").read_text())
        run = next(r for r in recorded["runs"] if r["config"] == "tkg_default_batch")
        calls, events, triplets = len(recorded["input"]["calls"]), run["events"], run["triplets"]
        stages = {stage: {"model": EMBEDDING_MODEL if stage == "embeddings" else "gpt-4.1-mini", "requests": s["requests"],
                          "input_tokens": s["input_tokens"], "cached_input_tokens": s["cached_input_tokens"],
                          "output_tokens": s["output_tokens"]} for stage, s in run["stages"].items()}
        source = "benchmarks/results/llm.json, tkg_default_batch repeat 1"
    return {"source": source, "calls": calls, "events": events, "triplets": triplets, "stages": stages}


def cost_estimate(sizes: list[dict], measured_llm: dict, real_corpus: dict | None) -> dict:
    """LLM requests, tokens and dollars a quarter of new calls costs at TARGET_COMPANIES, from
    the measured per-call accounting; the judge's share from judge-request rates (per 1,000 new
    events) measured on the real corpus and on the largest synthetic store; the global steps at
    TARGET_QUARTERS from power laws fitted on the measured sizes."""
    from tkg.llm.settings import BATCH_DISCOUNT, DEFAULT_PRICES

    calls = measured_llm["calls"]
    events_per_call = measured_llm["events"] / calls
    per_call = {stage: {k: round(v[k] / calls, 1) for k in ("requests", "input_tokens", "cached_input_tokens", "output_tokens")}
                for stage, v in measured_llm["stages"].items() if stage != "judge"}
    judge = measured_llm["stages"].get("judge")
    per_judge = {k: judge[k] / judge["requests"] for k in ("input_tokens", "cached_input_tokens", "output_tokens")} if judge else None

    def dollars(model: str, stage: str, tokens: dict) -> float:
        price = DEFAULT_PRICES[EMBEDDING_MODEL if stage == "embeddings" else model]
        uncached = tokens["input_tokens"] - tokens["cached_input_tokens"]
        return (uncached * price[0] + tokens["cached_input_tokens"] * price[1] + tokens["output_tokens"] * price[2]) / 1e6

    rates = {}
    if real_corpus:
        rates["real corpus"] = real_corpus["invalidation"]
    finished = [r for r in sizes if r.get("sharing")]
    if finished:
        rates[f"synthetic, {finished[-1]['store']['events']:,} events"] = finished[-1]["sharing"]["invalidation"]
    events_per_quarter = TARGET_COMPANIES * events_per_call
    total_events = TARGET_QUARTERS * events_per_quarter
    judge_work = {}
    for source, rate in rates.items():
        quarter_requests = rate["judge_requests_per_1000_new_events"] * events_per_quarter / 1000
        backfill_requests = rate["judge_requests_per_1000_events_whole_graph"] * total_events / 1000
        judge_work[source] = {
            "per_1000_new_events": rate["judge_requests_per_1000_new_events"], "requests_per_quarter": round(quarter_requests),
            "per_1000_events_whole_graph": rate["judge_requests_per_1000_events_whole_graph"],
            "requests_backfill_in_one_build": round(backfill_requests),
            "usd_per_quarter": {m: round(dollars(m, "judge", {k: v * quarter_requests for k, v in per_judge.items()}))
                                for m in ESTIMATE_MODELS} if per_judge else None,
            "usd_backfill_in_one_build": {m: round(dollars(m, "judge", {k: v * backfill_requests for k, v in per_judge.items()}))
                                          for m in ESTIMATE_MODELS} if per_judge else None}
    extraction = {m: round(sum(dollars(m, stage, t) for stage, t in per_call.items()) * TARGET_COMPANIES) for m in ESTIMATE_MODELS}
    # One call's extraction, answered synchronously and through the Batch API (half price; the
    # embeddings stay synchronous in batch mode, so they keep the list price).
    per_call_usd = {}
    for m in ESTIMATE_MODELS:
        llm = sum(dollars(m, stage, t) for stage, t in per_call.items() if stage != "embeddings")
        embeddings = dollars(m, "embeddings", per_call["embeddings"]) if "embeddings" in per_call else 0.0
        per_call_usd[m] = {"sync": round(llm + embeddings, 5), "batch": round(llm * BATCH_DISCOUNT + embeddings, 5)}
    # The test server's answers hold far fewer triplets per statement than the generator's
    # stores (and an LLM's): the triplets stage's output, scaled to the generator's ratio.
    triplet_ratio = None
    if finished and measured_llm.get("triplets"):
        store = finished[-1]["store"]
        triplet_ratio = (store["rows"]["triplets"] / store["events"]) / (measured_llm["triplets"] / measured_llm["events"])
    extra_output = per_call.get("triplets", {}).get("output_tokens", 0) * (triplet_ratio - 1) if triplet_ratio else 0
    projections = {}
    cold = [(r["store"]["events"] - r["held_back"]["events"], r["cold"]) for r in sizes if r.get("cold", {}).get("status") == "ok"]
    for step in (cold[-1][1]["steps"] if cold else {}):
        points = [(n, passed["steps"][step]) for n, passed in cold]
        time_fit = fit_power_law([(n, s["wall_s"]) for n, s in points][-2:])
        memory_fit = fit_power_law([(n, s["peak_rss_gb"]) for n, s in points][-2:])
        projections[step] = {
            "from_sizes": [n for n, _ in points][-2:],
            "time_exponent": round(time_fit[1], 2) if time_fit else None,
            "projected_wall_s": round(project(time_fit, total_events)) if time_fit else None,
            "memory_exponent": round(memory_fit[1], 2) if memory_fit else None,
            "projected_peak_rss_gb": round(project(memory_fit, total_events), 1) if memory_fit else None}
    return {
        "assumptions": {
            "companies": TARGET_COMPANIES, "quarters": TARGET_QUARTERS, "calls_per_quarter": TARGET_COMPANIES,
            "events_per_call": round(events_per_call, 1), "events_per_quarter": round(events_per_quarter),
            "events_after_40_quarters": round(total_events),
            "prices_usd_per_million_tokens": {m: dict(zip(("input", "cached_input", "output"), DEFAULT_PRICES[m]))
                                              for m in (*ESTIMATE_MODELS, EMBEDDING_MODEL)},
            "prices_note": "tkg.llm.settings.DEFAULT_PRICES (OpenAI standard-tier list prices), assumed as of 2026; "
                           "flex bills about half; per_call_usd and *_batch: the Batch API at half the price "
                           "for every LLM stage, embeddings synchronous",
            "per_call_source": measured_llm["source"],
        },
        "per_call": per_call,
        "per_call_usd": per_call_usd,
        "per_judge_request": {k: round(v) for k, v in per_judge.items()} if per_judge else None,
        "per_quarter": {
            "calls": TARGET_COMPANIES,
            "extraction_requests": round(sum(t["requests"] for t in per_call.values()) * TARGET_COMPANIES),
            "input_tokens": round(sum(t["input_tokens"] for t in per_call.values()) * TARGET_COMPANIES),
            "cached_input_tokens": round(sum(t["cached_input_tokens"] for t in per_call.values()) * TARGET_COMPANIES),
            "output_tokens": round(sum(t["output_tokens"] for t in per_call.values()) * TARGET_COMPANIES),
            "extraction_usd": extraction,
            "extraction_usd_batch": {m: round(v["batch"] * TARGET_COMPANIES) for m, v in per_call_usd.items()},
            "judge": judge_work,
            "triplet_output_sensitivity": {
                "triplets_per_statement_ratio_generator_over_test_server": round(triplet_ratio, 1) if triplet_ratio else None,
                "extra_output_tokens": round(extra_output * TARGET_COMPANIES),
                "extra_usd": {m: round(extra_output * TARGET_COMPANIES * DEFAULT_PRICES[m][2] / 1e6) for m in ESTIMATE_MODELS}},
        },
        "backfill_40_quarters_extraction_usd": {m: v * TARGET_QUARTERS for m, v in extraction.items()},
        "backfill_40_quarters_extraction_usd_batch": {m: round(v["batch"] * TARGET_COMPANIES) * TARGET_QUARTERS
                                                      for m, v in per_call_usd.items()},
        "global_steps_at_target": projections,
        "global_steps_note": f"one {TARGET_COMPANIES:,}-company store of {TARGET_QUARTERS} quarters, cold, at the shard count "
                             "measured; more shards keep each process smaller (the time is the sum over shards)",
    }


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------


def _pass_lines(label: str, passed: dict, cold: dict | None = None) -> list[str]:
    lines = []
    for name, step in passed["steps"].items():
        runs = f"{step['runs']} of {step['of']}" if "of" in step else f"{step['processes']} process(es)"
        versus = ""
        if cold is not None and name in cold["steps"] and cold["steps"][name]["wall_s"]:
            versus = f" ({step['wall_s'] / cold['steps'][name]['wall_s']:.0%} of cold)"
        counts = step.get("counts", {})
        said = "; ".join(line.split(": ", 1)[-1] for line in step.get("lines", []))[:120]  # the refresh runner's log lines
        ranked = (f"blocks kept {counts['blocks_kept']:,}, grown {counts.get('blocks_grown', 0):,}, "
                  f"ranked {counts['blocks_ranked']:,}" if "blocks_kept" in counts else "")
        notes = "; ".join(part for part in ("" if step["status"] == "ok" else step["status"], said, ranked) if part)
        lines.append(f"| | {label} | {name} | {runs} | {step['wall_s']}{versus} | {step['cpu_s']} | {step['peak_rss_gb']} | {notes} |")
    versus = f" ({passed['share_of_cold']:.1%} of cold)" if "share_of_cold" in passed else ""
    cpu_versus = f" ({passed['cpu_share_of_cold']:.1%} of cold)" if "cpu_share_of_cold" in passed else ""
    lines.append(f"| | {label} | **total** | | **{passed['wall_s']}**{versus} | **{passed['cpu_s']}**{cpu_versus} | "
                 f"**{passed['peak_rss_gb']}** | {passed['status']} |")
    return lines


def _of_companies(held: dict) -> str:
    companies = held.get("companies", "all")
    return "" if companies == "all" else f" ({companies} companies)"


def markdown(report: dict) -> str:
    lines = ["| store | pass | step | runs | wall s | CPU s | peak RSS GB | notes |", "|---|---|---|---:|---:|---:|---:|---|"]
    for row in report["sizes"]:
        store = row["store"]
        if store.get("status", "ok") != "ok" or "cold" not in row:
            lines.append(f"| {row['events_requested']:,} | generate | | | {store.get('wall_s')} | | | {store.get('status')} |")
            continue
        held = row["held_back"]
        lines.append(f"| **{store['events'] - held['events']:,} events** ({store['rows']['entities']:,} mentions, "
                     f"{store['partitions'] - held['partitions']:,} partitions, {row['shards']} shards) | | | | | | | |")
        lines += _pass_lines("cold", row["cold"])
        if "increment" in row:
            lines.append(f"| + {held['events']:,} events ({held['share_of_events']:.1%}) in {held['partitions']:,} partitions "
                         f"of {held['quarter']}{_of_companies(held)} | | | | | | | |")
            lines += _pass_lines("increment", row["increment"], row["cold"])
    estimate = report.get("cost_estimate")
    if estimate:
        q = estimate["per_quarter"]
        lines += ["", f"Per quarter of new calls ({q['calls']:,} calls): {q['extraction_requests']:,} extraction requests, "
                      f"{q['input_tokens']:,} input tokens ({q['cached_input_tokens']:,} cached), {q['output_tokens']:,} output tokens; "
                      + ", ".join(f"{m} ${v:,}" for m, v in q["extraction_usd"].items())]
        for source, work in q["judge"].items():
            lines.append(f"- judge ({source}): {work['requests_per_quarter']:,} requests a quarter "
                         + (", ".join(f"{m} ${v:,}" for m, v in work["usd_per_quarter"].items()) if work["usd_per_quarter"] else ""))
        projected = {step: p for step, p in estimate["global_steps_at_target"].items() if p["projected_wall_s"] is not None}
        if len(projected) < len(estimate["global_steps_at_target"]):
            lines.append("- no projection to 40 quarters for steps measured at fewer than two sizes (give --sizes two or more)")
        for step, p in projected.items():
            lines.append(f"- {step} at {estimate['assumptions']['events_after_40_quarters']:,} events: ~{p['projected_wall_s']} s "
                         f"(exponent {p['time_exponent']}), ~{p['projected_peak_rss_gb']} GB (exponent {p['memory_exponent']})")
    return "\n".join(lines)


def tkg_revision() -> dict:
    """The commit, and a hash of uncommitted changes under tkg/ and sql/ (other sessions edit the
    tree), new files not yet added included."""
    import subprocess

    def git(*arguments: str) -> str:
        return subprocess.run(["git", *arguments], check=True, cwd=HERE.parent, capture_output=True, text=True).stdout

    new = git("ls-files", "--others", "--exclude-standard", "--", "tkg", "sql").split()
    diff = git("diff", "HEAD", "--", "tkg", "sql") + "".join(f"\n+++ {name}\n" + (HERE.parent / name).read_text(errors="replace")
                                                             for name in new)
    changed = git("diff", "HEAD", "--name-only", "--", "tkg", "sql").split()
    return {"commit": git("rev-parse", "HEAD").strip(), "uncommitted_tkg_files": len(changed) + len(new),
            "uncommitted_diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,5000000,10000000", help="events per store, comma-separated")
    parser.add_argument("--increment-at", default="5000000",
                        help="sizes (comma-separated) at which the held-back quarter is then added and the increment measured")
    parser.add_argument("--increment-companies", type=int,
                        help="add the newest quarter of this many companies only (default: of every company)")
    parser.add_argument("--shards", type=int, default=8, help="TKG_SHARDS of the builds")
    parser.add_argument("--reuse", action="store_true", help="reuse a store an earlier run kept (--keep) instead of generating it")
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tkg_bench_scale")
    parser.add_argument("--step-timeout", type=float, default=1500.0, help="stop a step after this many seconds")
    parser.add_argument("--memory-guard-gb", type=float, default=20.0, help="stop a step whose resident memory passes this")
    parser.add_argument("--min-available-gb", type=float, default=1.0,
                        help="stop a step when the machine's available memory falls below this (it is shared)")
    parser.add_argument("--generate-timeout", type=float, default=3600.0)
    parser.add_argument("--generate-workers", type=int, default=2)
    parser.add_argument("--llm-home", type=Path, help="a data folder built with tkg's LLM path (for the per-call figures)")
    parser.add_argument("--real-home", type=Path,
                        help="a data folder built from the real corpus (its judge pairs give the real judge-request rate)")
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument("--resume", action="store_true", help="keep the sizes --output already holds; measure the others")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--runner", choices=("refresh", "steps"), default="refresh",
                        help="refresh: each pass as one refresh_and_publish run does it (global steps in one process, "
                             "shards in one worker process per core); steps: every global step and every shard in a "
                             "process of its own (each shard's own time and memory)")
    parser.add_argument("--worker-step", help=argparse.SUPPRESS)
    parser.add_argument("--worker-pass", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shard", help=argparse.SUPPRESS)
    parser.add_argument("--worker-generate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.increment_at = {int(size) for size in args.increment_at.split(",") if size.strip()}
    if args.worker_pass:
        return _worker_pass(args.store, args.shards)
    if args.worker_step:
        return _worker_step(args.worker_step, args.shard, args.store, args.shards)
    if args.worker_generate:
        return _worker_generate(args.worker_generate, args.events, args.generate_workers)

    def log(message: str) -> None:
        print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)

    if not synthetic.CORPUS.exists():
        print(f"SKIPPED: {synthetic.CORPUS} not found (the generator builds its names from the real corpus)")
        return 0
    started, load_start = time.perf_counter(), os.getloadavg()
    report = {
        "benchmark": "tkg's global half on synthetic stores of growing size, cold and after one new quarter",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "nice -n 5 python benchmarks/bench_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "niceness": os.nice(0),
        "tkg_revision": tkg_revision(),
        "config": {k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v)
                   for k, v in vars(args).items() if not k.startswith("worker")},
        "generator": {"events_per_call": synthetic.EVENTS_PER_CALL, "distinct_bases": synthetic.DISTINCT_BASES,
                      "calls_per_copy": len(synthetic.get_universe().calls)},
        "sizes": [],
    }
    if args.resume and args.output.exists():
        report["sizes"] = [r for r in json.loads(args.output.read_text())["sizes"] if r.get("cold", {}).get("status") == "ok"]
        report["resumed_from_earlier_run"] = [r["events_requested"] for r in report["sizes"]]
    for n in sorted(int(size) for size in args.sizes.split(",") if size.strip()):
        if any(r["events_requested"] == n for r in report["sizes"]):
            continue
        report["sizes"].append(measure_size(n, args, log))
        report["total_seconds"] = round(time.perf_counter() - started, 1)
        report["load_average_start_end"] = [[round(x, 2) for x in load_start], [round(x, 2) for x in os.getloadavg()]]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    report["llm_per_call_measured"] = per_call_llm(args.llm_home)
    if args.real_home:
        report["real_corpus"] = {"home": str(args.real_home), "resolution": resolution_sharing(args.real_home),
                                 "invalidation": invalidation_sharing(args.real_home, None)}
    report["cost_estimate"] = cost_estimate(report["sizes"], report["llm_per_call_measured"], report.get("real_corpus"))
    return write_report(report, args.output, markdown)


if __name__ == "__main__":
    sys.exit(main())
