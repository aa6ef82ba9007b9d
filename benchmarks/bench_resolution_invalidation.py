"""Benchmark: tkg's entity resolution and invalidation candidate selection vs a seed-faithful
implementation (benchmarks/seed_baseline.py), side by side on the same synthetic input built
from real names (benchmarks/synthetic.py).

    python benchmarks/bench_resolution_invalidation.py [--mentions 100000 --events 100000 --repeat 3]

For every size both sides run in this process on the same table, alternating, and the median
wall time over the repeats is reported (a side whose single run takes longer than
--long-run seconds is run once). A side whose projected time at a size exceeds its budget is
not run there; its figure is then an extrapolation (power law fitted on the measured sizes),
marked as such. Results: benchmarks/results/resolution_invalidation.json and a markdown
report on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import seed_baseline
import synthetic

RESULTS = HERE / "results" / "resolution_invalidation.json"


# ------------------------------------------------------------------------------------------
# Timing helpers
# ------------------------------------------------------------------------------------------


def _clear_tkg_caches() -> None:
    """Every per-name memo cache starts cold for every timed run (the registry, the nickname
    table and the wordllama model, loaded once per process, stay loaded: caches of size 1)."""
    import tkg.core.names
    import tkg.core.roles
    import tkg.resolve.resolution

    for module in (tkg.core.names, tkg.resolve.resolution, tkg.core.roles):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)) and value.cache_info().maxsize != 1:
                value.cache_clear()


def timed_runs(fn, repeat: int, long_run: float, before=None):
    """Run fn() up to `repeat` times; a run slower than `long_run` seconds ends the series."""
    times, result = [], None
    for _ in range(repeat):
        if before:
            before()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        if times[-1] > long_run:
            break
    return result, times


def fit_power_law(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """log t = a + b log n over the measured (n, t); None with fewer than two points."""
    points = [(n, t) for n, t in points if t and t > 0]
    if len(points) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([t for _, t in points])
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def project(fit: tuple[float, float] | None, n: int) -> float | None:
    return None if fit is None else float(math.exp(fit[0] + fit[1] * math.log(n)))


# ------------------------------------------------------------------------------------------
# Resolution quality
# ------------------------------------------------------------------------------------------


def _pair_count(counts: np.ndarray) -> int:
    counts = counts.astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())


def pairwise(truth: np.ndarray, predicted: np.ndarray) -> dict:
    """Pairwise precision/recall of a clustering, counted within clusters (no n^2 pair list)."""
    if truth.size == 0:
        return {"precision": None, "recall": None, "predicted_pairs": 0, "true_pairs": 0, "correct_pairs": 0}
    joint = truth.astype(np.int64) * (int(predicted.max()) + 1) + predicted.astype(np.int64)
    _, joint_counts = np.unique(joint, return_counts=True)
    _, truth_counts = np.unique(truth, return_counts=True)
    _, predicted_counts = np.unique(predicted, return_counts=True)
    correct, predicted_pairs, true_pairs = _pair_count(joint_counts), _pair_count(predicted_counts), _pair_count(truth_counts)
    precision = correct / predicted_pairs if predicted_pairs else 1.0
    recall = correct / true_pairs if true_pairs else 1.0
    return {"precision": round(precision, 4), "recall": round(recall, 4),
            "f1": round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0,
            "predicted_pairs": predicted_pairs, "true_pairs": true_pairs, "correct_pairs": correct}


def evaluate_resolution(mentions: synthetic.Mentions, predicted_ids: list[str], universe: synthetic.Universe) -> dict:
    codes: dict[str, int] = {}
    predicted = np.asarray([codes.setdefault(p, len(codes)) for p in predicted_ids], dtype=np.int64)
    truth = mentions.truth
    result = {"mention_pairs": pairwise(truth, predicted)}

    # Name level: one point per distinct (type, name); every side predicts per name.
    name_pred: dict[tuple[str, str], int] = {}
    name_truth: dict[tuple[str, str], int] = {}
    for t, n, tr, p in zip(mentions.types, mentions.names, truth.tolist(), predicted.tolist()):
        name_pred.setdefault((t, n), p)
        name_truth.setdefault((t, n), tr)
    keys = sorted(name_pred)
    result["name_pairs"] = pairwise(np.asarray([name_truth[k] for k in keys]), np.asarray([name_pred[k] for k in keys]))

    types = np.asarray(mentions.types)
    result["by_type"] = {t: pairwise(truth[types == t], predicted[types == t]) for t in synthetic.TYPES if (types == t).any()}

    # Variant kinds: does a non-canonical surface land with its identity's canonical surface?
    by_kind: dict[str, Counter] = defaultdict(Counter)
    missed: dict[str, list[str]] = defaultdict(list)
    kind_of = {(t, n): k for t, n, k in zip(mentions.types, mentions.names, mentions.kinds)}
    for (entity_type, name), kind in sorted(kind_of.items()):
        if kind == "canonical":
            continue
        identity = universe.identities[mentions.truth_ids[name_truth[(entity_type, name)]]]
        canonical_key = (entity_type, identity.canonical)
        if canonical_key not in name_pred:
            continue
        joined = name_pred[(entity_type, name)] == name_pred[canonical_key]
        by_kind[f"{entity_type}/{kind}"]["names"] += 1
        by_kind[f"{entity_type}/{kind}"]["joined"] += int(joined)
        if not joined and len(missed[f"{entity_type}/{kind}"]) < 4:
            missed[f"{entity_type}/{kind}"].append(f"{name} -/- {identity.canonical}")
    result["variant_recall"] = {k: {"names": c["names"], "joined": c["joined"], "recall": round(c["joined"] / c["names"], 3),
                                    "missed_examples": missed.get(k, [])}
                                for k, c in sorted(by_kind.items())}

    def probe(entity_type, a, b):
        pa_, pb_ = name_pred.get((entity_type, a)), name_pred.get((entity_type, b))
        return None if pa_ is None or pb_ is None else pa_ == pb_

    gold = []
    for case in synthetic.gold_alias_cases():
        same = probe("Person", case["a"], case["b"])
        gold.append({"id": case["id"], "a": case["a"], "b": case["b"], "expected_same": case["same"], "predicted_same": same,
                     "correct": same == case["same"]})
    result["gold_alias"] = {"correct": sum(g["correct"] for g in gold), "total": len(gold), "cases": gold}
    for label, probes, expected in (("alias_probes", synthetic.ALIAS_PROBES, True), ("trap_probes", synthetic.TRAP_PROBES, False)):
        rows = [{"type": t, "a": a, "b": b, "predicted_same": probe(t, a, b)} for t, a, b in probes]
        result[label] = {"correct": sum(r["predicted_same"] is expected for r in rows), "total": len(rows),
                         "failed": [f"{r['a']} / {r['b']}" for r in rows if r["predicted_same"] is not expected]}
    result["predicted_clusters"] = len(codes)
    result["true_clusters"] = len(mentions.truth_ids)
    return result


# ------------------------------------------------------------------------------------------
# Candidate quality: the same rule judge over either side's pairs
# ------------------------------------------------------------------------------------------


def retire(pairs: list[tuple[str, str]], views) -> dict[str, tuple[datetime, str]]:
    """tkg.invalidate.invalidation.invalidate()'s verdict application (RuleJudge, earliest retirement wins,
    a finished event's end only moves earlier), run on any list of (primary, secondary) pairs."""
    from tkg.invalidate.judges import JudgeCase, RuleJudge

    by_primary: dict[str, list[str]] = defaultdict(list)
    for primary, secondary in pairs:
        by_primary[primary].append(secondary)
    primaries = sorted(by_primary)
    cases = [JudgeCase(views[p], tuple(views[s] for s in by_primary[p])) for p in primaries]
    verdicts = RuleJudge().judge(cases)
    retired = {}
    for primary_id, case, case_verdicts in zip(primaries, cases, verdicts):
        winner = None
        for secondary, verdict in zip(case.candidates, case_verdicts):
            if verdict.invalidates and (winner is None or (secondary.valid_at, secondary.event_id) < (winner.valid_at, winner.event_id)):
                winner = secondary
        if winner is None:
            continue
        primary = views[primary_id]
        if primary.invalid_at is not None and winner.valid_at >= primary.invalid_at:
            continue
        retired[primary_id] = (winner.valid_at, winner.event_id)
    return retired


def evaluate_candidates(pairs: list[tuple[str, str]], expected: dict, views) -> dict:
    pair_set = set(pairs)
    secondaries: dict[str, set[str]] = defaultdict(set)
    for p, s in pair_set:
        secondaries[p].add(s)
    hit = sum(1 for e, (_, retirers) in expected.items() if secondaries.get(e, set()) & retirers)
    retired = retire(sorted(pair_set), views)
    correct = sum(1 for e, (at, _) in retired.items() if e in expected and expected[e][0] == at)
    return {
        "pairs": len(pair_set),
        "distinct_primaries": len(secondaries),
        "expected_invalidations": len(expected),
        "candidate_recall_earliest_retirer": round(hit / len(expected), 4) if expected else None,
        "retired_events": len(retired),
        "retired_correct": correct,
        "retirement_precision": round(correct / len(retired), 4) if retired else None,
        "retirement_recall": round(correct / len(expected), 4) if expected else None,
    }


# ------------------------------------------------------------------------------------------
# cProfile of tkg's candidate selection (diagnosis)
# ------------------------------------------------------------------------------------------


def profile_candidate_query(facts, links, path: Path) -> list[dict]:
    """Where tkg's candidate selection spends its time: the top functions by own time (cProfile)."""
    import cProfile
    import pstats

    from tkg.invalidate.candidates import select_candidates

    profiler = cProfile.Profile()
    profiler.runcall(select_candidates, facts, links)
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():
        rows.append({"operator": f"{Path(filename).name}:{line}({function})", "seconds": round(own, 3),
                     "rows_out": calls, "bytes_out": None, "detail": f"cumulative {cumulative:.3f} s"})
    rows.sort(key=lambda r: -r["seconds"])
    return rows[:6]


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = None
    try:
        memory = round(int(next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")).split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    import duckdb
    import rapidfuzz

    return {"cores": os.cpu_count(), "cpu": cpu, "memory_gb": memory, "python": platform.python_version(),
            "platform": platform.platform(), "duckdb": duckdb.__version__, "rapidfuzz": rapidfuzz.__version__}


def median(times: list[float]) -> float | None:
    return round(statistics.median(times), 3) if times else None


def run_resolution(sizes, args, universe, log) -> list[dict]:
    from tkg.resolve.resolution import resolve_entities

    rows = []
    measured: dict[str, list[tuple[int, float]]] = defaultdict(list)
    warm = synthetic.generate_mentions(500, universe)
    resolve_entities(warm.table)  # loads the nickname table, registry and cleanco once
    for n in sizes:
        mentions = synthetic.generate_mentions(n, universe)
        names = len(set(zip(mentions.types, mentions.names)))
        row = {"size": n, "distinct_names": names, "true_clusters": len(mentions.truth_ids), "sides": {}}
        log(f"resolution n={n}: {names} distinct (type, name), {len(mentions.truth_ids)} true clusters")
        without_embeddings = mentions.table.set_column(
            mentions.table.schema.get_field_index("embedding"), "embedding",
            pa.nulls(mentions.table.num_rows, type=mentions.table.schema.field("embedding").type))
        sides = {
            "tkg": (lambda t=mentions.table: resolve_entities(t), _clear_tkg_caches, None),
            "tkg_without_embeddings": (lambda t=without_embeddings: resolve_entities(t), _clear_tkg_caches, None),
            "seed": (lambda t=mentions.table: seed_baseline.resolve(t), None, args.seed_budget),
            "seed_vectorised": (lambda t=mentions.table: seed_baseline.resolve(t, vectorised=True), None, args.seed_budget),
        }
        for side, (fn, before, budget) in sides.items():
            projected = project(fit_power_law(measured[side][-3:]), n)
            if budget is not None and projected is not None and projected > budget:
                row["sides"][side] = {"median_s": round(projected, 1), "runs": 0, "extrapolated": True,
                                      "note": f"projected {projected:.0f}s > budget {budget:.0f}s; power law on {measured[side][-3:]}"}
                log(f"  {side}: skipped, projected {projected:.0f}s")
                continue
            result, times = timed_runs(fn, args.repeat, args.long_run, before)
            measured[side].append((n, statistics.median(times)))
            if side.startswith("tkg"):
                mapping = dict(zip(result.mapping.column("entity_id").to_pylist(), result.mapping.column("canonical_id").to_pylist()))
            else:
                mapping = result.mapping
            predicted = [mapping.get(e, f"unresolved:{e}") for e in mentions.table.column("entity_id").to_pylist()]
            quality = evaluate_resolution(mentions, predicted, universe) if side in ("tkg", "seed") else None
            entry = {"median_s": median(times), "runs": len(times), "times_s": [round(t, 3) for t in times], "extrapolated": False}
            if side == "seed_vectorised":
                entry["same_clusters_as_seed_loop"] = _same_partition(predicted, row["sides"].get("seed", {}).get("_predicted"))
            elif side == "tkg_without_embeddings":
                entry["same_clusters_as_tkg"] = _same_partition(predicted, row["sides"]["tkg"].get("_predicted"))
            else:
                entry["quality"] = quality
                entry["_predicted"] = predicted
            entry["counts"] = dict(result.counts)
            if side == "tkg":
                methods = Counter(m.split(":")[0] for m in result.mapping.column("method").to_pylist())
                entry["mentions_by_method"] = dict(methods)
            row["sides"][side] = entry
            log(f"  {side}: median {entry['median_s']}s over {len(times)} run(s)"
                + (f", pairwise P={quality['mention_pairs']['precision']} R={quality['mention_pairs']['recall']}" if quality else ""))
        for entry in row["sides"].values():
            entry.pop("_predicted", None)
        if n == sizes[-1]:
            row["tkg_profile"] = profile_resolution(mentions.table)
        rows.append(row)
    return _fill_extrapolations(rows, measured)


def _fill_extrapolations(rows: list[dict], measured: dict[str, list[tuple[int, float]]]) -> list[dict]:
    """Project the sides that were skipped at a size, from the full series of measured sizes."""
    for row in rows:
        for side, entry in row["sides"].items():
            if entry.get("extrapolated"):
                fit = fit_power_law(measured[side][-3:])
                entry["median_s"] = round(project(fit, row["size"]), 1) if fit else None
                entry["fit"] = {"exponent": round(fit[1], 2), "points": measured[side][-3:]} if fit else None
    return rows


def profile_resolution(table) -> list[dict]:
    """cProfile of one (cold-cache) tkg.resolve.resolution.resolve_entities run: where the time goes."""
    import cProfile
    import pstats

    from tkg.resolve.resolution import resolve_entities

    _clear_tkg_caches()
    profiler = cProfile.Profile()
    profiler.enable()
    resolve_entities(table)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, function), (calls, _, own, cumulative, _) in stats.stats.items():
        if "tkg" in filename or own > 0.2:
            rows.append({"function": f"{Path(filename).name}:{line}({function})", "calls": calls,
                         "own_s": round(own, 3), "cumulative_s": round(cumulative, 3)})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:8]


def _same_partition(a: list[str] | None, b: list[str] | None) -> bool | None:
    if a is None or b is None:
        return None
    pairs = set(zip(a, b))
    return len(pairs) == len(set(a)) == len(set(b))


def run_candidates(sizes, args, universe, log) -> list[dict]:
    from tkg.invalidate import invalidation

    rows = []
    measured: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for n in sizes:
        start = time.perf_counter()
        events = synthetic.generate_events(n, universe)
        generated = time.perf_counter() - start
        start = time.perf_counter()
        facts = invalidation._fact_events(events.events, events.triplets)
        links = invalidation._links(events.triplets, facts)
        prepared = time.perf_counter() - start
        views = invalidation._event_views(facts, events.triplets)
        row = {"size": n, "fact_events": facts.num_rows, "links": links.num_rows, "expected_invalidations": len(events.expected),
               "generate_s": round(generated, 2), "embed_s": round(events.embed_seconds, 2), "prepare_facts_links_s": round(prepared, 3),
               "templates": {k: v for k, v in events.counts.items()}, "sides": {}}
        log(f"candidates n={n}: {facts.num_rows} FACT non-ATEMPORAL events, {links.num_rows} links, "
            f"{len(events.expected)} expected invalidations (generated in {generated:.1f}s, wordllama {events.embed_seconds:.1f}s)")
        sides = {
            "tkg": (lambda f=facts, k=links: invalidation.select_candidates(f, k), args.tkg_candidate_budget),
            "seed": (lambda f=facts, k=links: seed_baseline.select_candidates(f, k), args.seed_budget),
        }
        for side, (fn, budget) in sides.items():
            projected = project(fit_power_law(measured[side][-3:]), n)
            if budget is not None and projected is not None and projected > budget:
                row["sides"][side] = {"median_s": None, "runs": 0, "extrapolated": True,
                                      "note": f"projected {projected:.0f}s > budget {budget:.0f}s"}
                log(f"  {side}: skipped, projected {projected:.0f}s > budget {budget:.0f}s")
                continue
            repeat = args.repeat if projected is None or projected * args.repeat <= args.long_run * 2 else 1
            if side == "tkg" and n > args.isolate_above:
                times, pairs, extra = isolated_tkg_candidates(facts, links, repeat, args)
                if not times:
                    row["sides"][side] = {"median_s": None, "runs": 0, "extrapolated": False, **extra,
                                          "projected_s": round(projected, 1) if projected else None}
                    log(f"  {side}: {extra['status']}")
                    continue
                measured[side].append((n, statistics.median(times)))
            else:
                result, times = timed_runs(fn, repeat, args.long_run)
                measured[side].append((n, statistics.median(times)))
            if side == "tkg":
                if n <= args.isolate_above:
                    pairs = list(zip(result.column("primary_event_id").to_pylist(), result.column("secondary_event_id").to_pylist()))
                    extra = {}
            else:
                pairs = result.pairs
                extra = {"judge_calls": result.judge_calls, "selections_after_top_k": result.selected,
                         "shared_entity_pairs": result.counts["shared_entity_pairs"],
                         "temporal_filter_pairs": result.counts["temporal_pairs"]}
            quality = evaluate_candidates(pairs, events.expected, views)
            row["sides"][side] = {"median_s": median(times), "runs": len(times), "times_s": [round(t, 3) for t in times],
                                  "extrapolated": False, **quality, **extra}
            log(f"  {side}: median {median(times)}s over {len(times)} run(s); {quality['pairs']} pairs; "
                f"earliest-retirer recall {quality['candidate_recall_earliest_retirer']}; retirement P={quality['retirement_precision']} "
                f"R={quality['retirement_recall']}")
        if n <= args.invalidate_max:
            start = time.perf_counter()
            outcome = invalidation.invalidate(events.events, events.triplets, invalidation.RuleJudge())
            seconds = time.perf_counter() - start
            retired = {r["event_id"]: r["invalid_at"] for r in outcome.event_invalidations.to_pylist()}
            correct = sum(1 for e, at in retired.items() if e in events.expected and events.expected[e][0] == at)
            row["tkg_invalidate_end_to_end"] = {
                "seconds": round(seconds, 3), "judged_pairs": outcome.counts["judged_pairs"], "retired_events": len(retired),
                "retired_correct": correct,
                "retirement_precision": round(correct / len(retired), 4) if retired else None,
                "retirement_recall": round(correct / len(events.expected), 4) if events.expected else None,
            }
            log(f"  tkg invalidate() end to end (RuleJudge): {seconds:.1f}s, {len(retired)} retired, {correct} as expected")
        if n == args.profile_size:
            row["tkg_query_profile"] = profile_candidate_query(facts, links, Path(os.environ.get("TMPDIR", "/tmp")) / f"tkg_profile_{os.getpid()}.json")
        rows.append(row)
    return _fill_extrapolations(rows, measured)


def _worker_candidates(directory: Path, repeat: int, long_run: float, memory_cap_gb: float) -> int:
    """Child process: tkg.invalidate.invalidation.select_candidates on the facts/links parquet in `directory`."""
    import resource

    import pyarrow.parquet as pq

    if memory_cap_gb > 0:
        cap = int(memory_cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from tkg.invalidate.candidates import select_candidates

    facts, links = pq.read_table(directory / "facts.parquet"), pq.read_table(directory / "links.parquet")
    result, times = timed_runs(lambda: select_candidates(facts, links), repeat, long_run)
    pq.write_table(result.select(["primary_event_id", "secondary_event_id"]), directory / "pairs.parquet")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"times": times, "peak_rss_gb": round(peak, 2)}))
    return 0


def _meminfo_gb(field: str) -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class ChildRun:
    """How a watched child process ended: its exit code, or why the watcher stopped it."""

    returncode: int | None
    stopped: str | None  # "stopped: ..." when the memory guard or the timeout ended it
    peak_rss_kb: int
    elapsed_s: float
    samples: list[tuple[float, int]]  # (epoch seconds, resident kB), every `interval` seconds
    error_tail: str = ""  # the last lines of its stderr when it failed

    @property
    def failure(self) -> str:
        code = self.returncode or 0
        return f"killed by signal {-code}" if code < 0 else f"failed (exit {code})"


def watch_child(command: list[str], directory: Path, timeout_s: float, guard_gb: float, min_available_gb: float = 0.0,
                interval: float = 0.25) -> ChildRun:
    """Run `command` in `directory` (stdout and stderr to files there) and sample its resident
    memory; stop it when it passes `guard_gb`, runs past `timeout_s`, or the machine's available
    memory falls below `min_available_gb`, so that running out of memory is a result, not a crash."""
    import subprocess

    start = time.perf_counter()
    peak_kb, stopped, samples = 0, None, []
    with open(directory / "stdout", "w") as out, open(directory / "stderr", "w") as err:
        child = subprocess.Popen(command, cwd=directory, stdout=out, stderr=err)
        while child.poll() is None:
            rss_kb = _rss_kb(child.pid)
            samples.append((time.time(), rss_kb))
            peak_kb = max(peak_kb, rss_kb)
            elapsed = time.perf_counter() - start
            available = _meminfo_gb("MemAvailable") if min_available_gb else None
            if guard_gb and rss_kb > guard_gb * 2**20:
                stopped = f"stopped: resident memory passed the {guard_gb:.0f} GB guard after {elapsed:.0f}s"
            elif elapsed > timeout_s:
                stopped = f"stopped: still running after {elapsed:.0f}s (timeout)"
            elif available is not None and available < min_available_gb:
                stopped = (f"stopped: the machine's available memory fell to {available} GB after {elapsed:.0f}s "
                           f"(resident {rss_kb / 2**20:.1f} GB)")
            if stopped:
                child.kill()
                child.wait()
                break
            time.sleep(interval)
    tail = ""
    if not stopped and child.returncode != 0:
        tail = " | ".join((directory / "stderr").read_text().strip().splitlines()[-3:])[-400:]
    return ChildRun(child.returncode, stopped, peak_kb, time.perf_counter() - start, samples, tail)


def isolated_tkg_candidates(facts, links, repeat: int, args) -> tuple[list[float], list | None, dict]:
    """Run tkg's candidate selection in a child process (own working directory for DuckDB's spill
    files, an address-space cap, a timeout) so that running out of memory is a result, not a crash."""
    import shutil
    import tempfile

    import pyarrow.parquet as pq

    directory = Path(tempfile.mkdtemp(prefix="tkg_bench_"))
    try:
        pq.write_table(facts, directory / "facts.parquet")
        pq.write_table(links, directory / "links.parquet")
        command = [sys.executable, str(Path(__file__).resolve()), "--worker-candidates", str(directory),
                   "--repeat", str(repeat), "--long-run", str(args.long_run), "--tkg-memory-cap-gb", str(args.tkg_memory_cap_gb)]
        available_gb = _meminfo_gb("MemAvailable")
        run = watch_child(command, directory, args.tkg_candidate_timeout, args.tkg_memory_guard_gb)
        info = {"elapsed_s": round(run.elapsed_s, 1), "peak_rss_gb_sampled": round(run.peak_rss_kb / 2**20, 2),
                "machine_memory_available_gb_at_start": available_gb, "machine_load_at_end": [round(x, 1) for x in os.getloadavg()]}
        if run.stopped:
            return [], None, {"status": run.stopped, **info}
        if run.returncode != 0:
            return [], None, {"status": run.failure, **info, "error": run.error_tail}
        completed = type("Completed", (), {"stdout": (directory / "stdout").read_text()})
        report = json.loads(completed.stdout.strip().splitlines()[-1])
        pairs_table = pq.read_table(directory / "pairs.parquet")
        pairs = list(zip(pairs_table.column("primary_event_id").to_pylist(), pairs_table.column("secondary_event_id").to_pylist()))
        return report["times"], pairs, {"status": "ok", "peak_rss_gb": report["peak_rss_gb"], **info}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def ratio(row: dict, slow: str, fast: str) -> str:
    a, b = row["sides"].get(slow, {}).get("median_s"), row["sides"].get(fast, {}).get("median_s")
    return f"{a / b:.2f}x" if a and b else "n/a"


def fmt_time(entry: dict | None) -> str:
    if entry and entry.get("median_s") is None and entry.get("status"):
        return "did not finish (see below)"
    if not entry or entry.get("median_s") is None:
        return "n/a"
    text = f"{entry['median_s']:.2f}s" if entry["median_s"] < 100 else f"{entry['median_s']:.0f}s"
    if entry.get("extrapolated"):
        return f"~{text} (extrapolated)"
    return f"{text} (n={entry['runs']})"


def markdown(report: dict) -> str:
    lines = [f"### Entity resolution ({report['machine']['cores']} cores, {report['machine']['cpu']})", "",
             ("| mentions | distinct names | tkg | tkg, no embeddings | seed (Python pair loops) | seed (vectorised) | seed loop / tkg "
             "| seed vec / tkg | tkg P / R (pairs) | seed P / R (pairs) | gold aliases tkg / seed |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for row in report["resolution"]:
        tkg, seed = row["sides"]["tkg"], row["sides"]["seed"]
        tq, sq = tkg.get("quality"), seed.get("quality")
        pr = lambda q: f"{q['mention_pairs']['precision']:.3f} / {q['mention_pairs']['recall']:.3f}" if q else "n/a"
        gold = lambda q: f"{q['gold_alias']['correct']}/{q['gold_alias']['total']}" if q else "n/a"
        lines.append(f"| {row['size']:,} | {row['distinct_names']:,} | {fmt_time(tkg)} | "
                     f"{fmt_time(row['sides'].get('tkg_without_embeddings'))} | {fmt_time(seed)} | "
                     f"{fmt_time(row['sides'].get('seed_vectorised'))} | {ratio(row, 'seed', 'tkg')} | "
                     f"{ratio(row, 'seed_vectorised', 'tkg')} | {pr(tq)} | {pr(sq)} | {gold(tq)} / {gold(sq)} |")
    largest = report["resolution"][-1]
    tq, sq = largest["sides"]["tkg"].get("quality"), largest["sides"]["seed"].get("quality")
    if tq and sq:
        lines += ["", f"Quality at {largest['size']:,} mentions (pairwise over mentions / over distinct names):", "",
                  "| | tkg P | tkg R | seed P | seed R |", "|---|---:|---:|---:|---:|"]
        lines.append(f"| all mentions | {tq['mention_pairs']['precision']} | {tq['mention_pairs']['recall']} | "
                     f"{sq['mention_pairs']['precision']} | {sq['mention_pairs']['recall']} |")
        lines.append(f"| distinct names | {tq['name_pairs']['precision']} | {tq['name_pairs']['recall']} | "
                     f"{sq['name_pairs']['precision']} | {sq['name_pairs']['recall']} |")
        for entity_type in tq["by_type"]:
            a, b = tq["by_type"][entity_type], sq["by_type"][entity_type]
            lines.append(f"| {entity_type} | {a['precision']} | {a['recall']} | {b['precision']} | {b['recall']} |")
        lines += ["", (f"Probes: gold aliases tkg {tq['gold_alias']['correct']}/{tq['gold_alias']['total']}, seed "
                  f"{sq['gold_alias']['correct']}/{sq['gold_alias']['total']}; alias pairs joined tkg "
                  f"{tq['alias_probes']['correct']}/{tq['alias_probes']['total']}, seed {sq['alias_probes']['correct']}/"
                  f"{sq['alias_probes']['total']}; traps kept apart tkg {tq['trap_probes']['correct']}/{tq['trap_probes']['total']}, "
                  f"seed {sq['trap_probes']['correct']}/{sq['trap_probes']['total']}."),
                  (f"tkg missed aliases: {', '.join(tq['alias_probes']['failed']) or 'none'}; merged traps: "
                  f"{', '.join(tq['trap_probes']['failed']) or 'none'}."),
                  (f"seed missed aliases: {', '.join(sq['alias_probes']['failed']) or 'none'}; merged traps: "
                  f"{', '.join(sq['trap_probes']['failed']) or 'none'}.")]
        split = largest["sides"]["tkg"].get("mentions_by_method", {}).get("split", 0)
        lines += ["", f"tkg mentions mapped to a 'split' canonical (a second cluster that reached an already-used canonical): {split}."]
        weak = [(k, v) for k, v in tq["variant_recall"].items() if v["recall"] < 0.9]
        if weak:
            lines += ["", "tkg variant kinds joined to their canonical spelling less than 90% of the time: "
                      + ", ".join(f"{k} {v['joined']}/{v['names']}" for k, v in weak) + "."]
    if largest.get("tkg_profile"):
        lines += ["", f"Where tkg's resolution spends its time at {largest['size']:,} mentions (cProfile, own time):", "",
                  "| function | calls | own s | cumulative s |", "|---|---:|---:|---:|"]
        lines += [f"| {r['function']} | {r['calls']} | {r['own_s']} | {r['cumulative_s']} |" for r in largest["tkg_profile"]]
    lines += ["", "### Invalidation candidate selection", "",
              ("| events | FACT events | tkg select_candidates | seed per-event loop | seed / tkg time | pairs tkg / seed "
              "| primaries tkg / seed | earliest-retirer recall tkg / seed | retirement P / R tkg | retirement P / R seed |"),
              "|---:|---:|---:|---:|---:|---|---|---|---|---|"]
    for row in report["candidates"]:
        tkg, seed = row["sides"].get("tkg", {}), row["sides"].get("seed", {})
        pr = lambda e: f"{e.get('retirement_precision')} / {e.get('retirement_recall')}" if e.get("pairs") is not None else "n/a"
        lines.append(f"| {row['size']:,} | {row['fact_events']:,} | {fmt_time(tkg)} | {fmt_time(seed)} | "
                     f"{ratio(row, 'seed', 'tkg')} | {tkg.get('pairs', 'n/a')} / {seed.get('pairs', 'n/a')} | "
                     f"{tkg.get('distinct_primaries', 'n/a')} / {seed.get('distinct_primaries', 'n/a')} | "
                     f"{tkg.get('candidate_recall_earliest_retirer', 'n/a')} / {seed.get('candidate_recall_earliest_retirer', 'n/a')} | "
                     f"{pr(tkg)} | {pr(seed)} |")
    for row in report["candidates"]:
        tkg = row["sides"].get("tkg", {})
        if tkg.get("status"):
            projected = f"; power-law projection from the smaller sizes: {tkg['projected_s']:.0f}s" if tkg.get("projected_s") else ""
            peak = tkg.get("peak_rss_gb") or tkg.get("peak_rss_gb_sampled")
            lines.append(f"\ntkg select_candidates at {row['size']:,} events, run in a child process: {tkg['status']}"
                         f" (wall {tkg.get('elapsed_s')}s, peak resident memory {peak} GB){projected}.")
    for row in report["candidates"]:
        if "tkg_invalidate_end_to_end" in row:
            e = row["tkg_invalidate_end_to_end"]
            lines.append(f"\ntkg `invalidate()` end to end with RuleJudge at {row['size']:,} events: {e['seconds']}s, "
                         f"{e['retired_events']} events retired, precision {e['retirement_precision']}, recall {e['retirement_recall']}.")
        if "tkg_query_profile" in row:
            lines.append(f"\nWhere tkg's candidate selection spends its time at {row['size']:,} events (cProfile, own time):\n")
            lines.append("| operator | seconds | rows out | bytes out | detail |\n|---|---:|---:|---:|---|")
            for op in row["tkg_query_profile"]:
                lines.append(f"| {op['operator']} | {op['seconds']} | {op['rows_out']:,} | {op['bytes_out'] or 0:,} | {op['detail'][:90]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mentions", type=int, default=100_000, help="largest mention set (default 100000)")
    parser.add_argument("--events", type=int, default=100_000, help="largest event set (default 100000)")
    parser.add_argument("--sizes", default="5000,10000,20000,40000", help="smaller sizes also measured, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--long-run", type=float, default=120.0, help="a run slower than this (s) is not repeated")
    parser.add_argument("--seed-budget", type=float, default=1200.0, help="max projected seconds for one seed run")
    parser.add_argument("--tkg-candidate-budget", type=float, default=1200.0, help="max projected seconds for one tkg candidate run")
    parser.add_argument("--invalidate-max", type=int, default=20_000, help="time tkg's full invalidate() up to this many events")
    parser.add_argument("--profile-size", type=int, default=10_000, help="profile tkg's candidate query at this size (0: never)")
    parser.add_argument("--isolate-above", type=int, default=20_000,
                        help="run tkg's candidate selection in a child process above this many events")
    parser.add_argument("--tkg-candidate-timeout", type=float, default=660.0, help="timeout (s) of that child process")
    parser.add_argument("--tkg-memory-guard-gb", type=float, default=21.0,
                        help="stop that child process when its resident memory passes this (0: never)")
    parser.add_argument("--tkg-memory-cap-gb", type=float, default=0.0, help="address-space cap (RLIMIT_AS) of that child (0: none)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--worker-candidates", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_candidates:
        return _worker_candidates(args.worker_candidates, args.repeat, args.long_run, args.tkg_memory_cap_gb)

    def log(message: str) -> None:
        print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)

    try:
        universe = synthetic.get_universe()
    except synthetic.CorpusMissing as error:
        print(f"SKIPPED: {error}")
        return 0
    small = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    mention_sizes = sorted({s for s in small if s < args.mentions} | {args.mentions})
    event_sizes = sorted({s for s in small if s < args.events} | {args.events})
    started = time.perf_counter()
    load_start = os.getloadavg()
    log(f"universe: {sum(len(v) for v in universe.by_type.values())} identities, "
        f"{sum(len(i.surfaces) for v in universe.by_type.values() for i in v)} surfaces from {len(universe.calls)} real calls")
    resolution = run_resolution(mention_sizes, args, universe, log)
    candidates = run_candidates(event_sizes, args, universe, log)
    report = {
        "benchmark": "entity resolution and invalidation candidate selection: tkg vs seed-faithful",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_resolution_invalidation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "universe": {t: {"identities": len(v), "surfaces": sum(len(i.surfaces) for i in v)} for t, v in sorted(universe.by_type.items())},
        "resolution": resolution,
        "candidates": candidates,
        "total_seconds": round(time.perf_counter() - started, 1),
        "load_average_start_end": [[round(x, 2) for x in load_start], [round(x, 2) for x in os.getloadavg()]],
    }
    return write_report(report, args.output, markdown)


def write_report(report: dict, output: Path, render) -> int:
    """Write a benchmark's JSON to `output` and print its tables (`render`)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render(report))
    print(f"\nResults: {output} (total {report['total_seconds']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
