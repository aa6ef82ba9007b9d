"""A backfill launched as the UI launches it, against `tkg build` of the same source.

    python benchmarks/bench_backfill.py                                  # the sample: batched vs one partition per run
    python benchmarks/bench_backfill.py --baseline 1cad107               # ... and the tkg of that commit, side by side
    python benchmarks/bench_backfill.py --source corpus --variants 50    # the real corpus, batched only
    python benchmarks/bench_backfill.py --fail-one                       # one partition made to fail, then healed

Each variant gets a fresh data folder and its own `dagster dev` (webserver and daemon, the way
`tkg dev` starts them) on that folder. The benchmark then launches, through the GraphQL API,
`launchPartitionBackfill` of every partition of the seven partitioned stages, as the UI's
*Materialize all* does, and waits until the backfill has finished, the `tkg_automation` sensor
has refreshed the global assets and the warehouse, and no run has been in progress for
`--quiet` seconds. Wall time runs from the launch to the end of the last run. It records the
runs started and failed (backfill runs and automation runs), the backfill's partition counts
as they moved (what the backfill page shows), and whether every published table equals the
one `tkg build` published (transaction times left out: they are when a row was written).

Variants are TKG_PARTITIONS_PER_RUN values of this tree (1 is the old one partition per run),
plus `--baseline REV`: the tkg of that git revision at its own defaults.

`--fail-one` corrupts one call of the source (its text is no longer a transcript), backfills,
checks that exactly that partition is failed, restores the row, re-executes the backfill's
failed partitions (`reexecutePartitionBackfill`, FROM_FAILURE, as the UI's *Re-execute*
does) and checks that only it was rebuilt and the graph then equals `tkg build`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TKG_SHARED", ROOT.parent / "shared"))
CORPUS = SHARED / "data" / "earnings_calls" / "transcripts.parquet"
PARTITIONED = ["transcripts", "chunks", "statements", "temporal_events", "triplets", "figures", "entities"]
# Published tables compared with tkg build's, without the columns that say when a row was written.
TABLES = ["transcripts", "chunks", "statements", "events", "triplets", "entities", "canonical_entities", "entity_aliases",
          "facts", "metrics", "officers", "fact_history", "invalidation_judgments"]
TRANSACTION_TIMES = {"created_at", "expired_at", "ingested_at", "recorded_at"}
IN_PROGRESS = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def clean_environment(home: Path, code: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TKG_LLM", "DAGSTER_HOME", "TKG_PARTITIONS_PER_RUN",
                        "TKG_RUN_WORKERS") and not k.startswith("TKG_")}
    env.update(TKG_HOME=str(home), DAGSTER_HOME=str(home / "dagster_home"), PYTHONPATH=str(code))
    return env


def tkg_build(source: str, home: Path) -> tuple[float, float]:
    """Wall and CPU seconds (with its worker processes) of `tkg build` of `source`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "tkg.cli", "build", "--source", source], cwd=ROOT,
                               env=clean_environment(home, ROOT), capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"tkg build failed:\n{completed.stderr[-3000:]}")
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def published(home: Path) -> dict[str, list]:
    import duckdb

    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        tables = {}
        for table in TABLES:
            columns = [row[0] for row in connection.execute(f"DESCRIBE {table}").fetchall()]
            kept = ", ".join(f'"{c}"' for c in columns if c not in TRANSACTION_TIMES)
            tables[table] = connection.execute(f"SELECT {kept} FROM {table} ORDER BY ALL").fetchall()
    return tables


def differences(home: Path, reference: dict[str, list]) -> dict[str, str]:
    if not (home / "tkg.duckdb").exists():
        return {"warehouse": "not published"}
    mine = published(home)
    return {table: f"{len(mine[table])} rows vs {len(rows)}" for table, rows in reference.items() if mine[table] != rows}


class Dagster:
    """`dagster dev` on a data folder: the webserver and the daemon, as `tkg dev` starts them."""

    def __init__(self, code: Path, home: Path, source: str, extra_env: dict[str, str]):
        self.port = _free_port()
        self.env = {**clean_environment(home, code), "TKG_SOURCE": source, **extra_env}
        self.home = home
        prepare = "from pathlib import Path; from tkg_assets.instance import open_instance; import sys; " \
                  "open_instance(Path(sys.argv[1])).dispose()"
        subprocess.run([sys.executable, "-c", prepare, str(home / "dagster_home")], cwd=code, env=self.env, check=True,
                       capture_output=True)
        self.log = open(home / "dagster_dev.log", "w")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml", "-p", str(self.port)],
            cwd=code, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while True:
            try:
                if self.query("{ version }").get("version"):
                    break
            except OSError:
                pass
            if time.time() > deadline or self.process.poll() is not None:
                raise SystemExit(f"dagster dev did not come up; see {home / 'dagster_dev.log'}")
            time.sleep(2)

    def query(self, text: str, variables: dict | None = None) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql",
                                         data=json.dumps({"query": text, "variables": variables or {}}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        if answer.get("errors"):
            raise RuntimeError(answer["errors"])
        return answer["data"]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of the processes `dagster dev` started, by role: the daemon, the
        webserver, the code servers, and the runs (the processes runs were started from, with
        their finished children: Dagster's spawned runs, or tkg's forkserver and its runs)."""
        tick = os.sysconf("SC_CLK_TCK")
        roles: dict[str, float] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(stat[3]) != self.process.pid:  # not in dagster dev's session
                continue
            own, children = (int(stat[11]) + int(stat[12])) / tick, (int(stat[13]) + int(stat[14])) / tick
            role = ("daemon" if "dagster._daemon" in command else "webserver" if "dagster_webserver" in command
                    else "runs" if "forkserver" in command else "code_server" if "grpc" in command or "code-server" in command
                    else "dagster_dev" if " dev " in command else "other")
            roles[role] = roles.get(role, 0.0) + own
            # a code server's finished children are runs it spawned; the forkserver's are its runs
            child_role = "runs" if role in ("code_server", "runs") else role
            roles[child_role] = roles.get(child_role, 0.0) + children
        return {role: round(seconds, 1) for role, seconds in sorted(roles.items())}

    def stop(self) -> None:
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
        self.log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on InvalidSubsetError { message } } }"""
REEXECUTE = """mutation($params: ReexecutionParams!) { reexecutePartitionBackfill(reexecutionParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL = """query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  status numPartitions assetBackfillData { assetBackfillStatuses { ... on AssetPartitionsStatusCounts {
  assetKey { path } numPartitionsTargeted numPartitionsInProgress numPartitionsMaterialized numPartitionsFailed } } } } } }"""
RUNS = """{ runsOrError { ... on Runs { results { runId status jobName creationTime startTime endTime
  tags { key value } assetSelection { path } stepStats { stepKey startTime endTime } } } } }"""
# What the wait polls every 2 s: the runs' states only. Step stats make the webserver read every
# event of every run (thousands of materialisations per batched run), CPU the backfill's runs
# would otherwise have; they are read once, at the end.
RUN_STATES = """{ runsOrError { ... on Runs { results { runId status endTime } } } }"""


def backfill(dagster: Dagster, params: dict, quiet: float, mutation: str = LAUNCH) -> dict:
    """Launch a backfill, follow it to the end and until the graph is published and no run has
    been in progress for `quiet` seconds; what happened."""
    before = {run["runId"] for run in runs(dagster)}
    cpu_before = dagster.cpu_seconds()
    launched = time.time()
    answer = next(iter(dagster.query(mutation, {"params": params}).values()))
    if "backfillId" not in answer:
        raise SystemExit(f"the backfill was not launched: {answer}")
    backfill_id, progress, finished, idle_since = answer["backfillId"], [], None, None
    while True:
        time.sleep(2)
        state = dagster.query(BACKFILL, {"id": backfill_id})["partitionBackfillOrError"]
        counts = {tuple(s["assetKey"]["path"])[0]: s for s in state["assetBackfillData"]["assetBackfillStatuses"]}
        first = counts.get("transcripts") or next(iter(counts.values()))
        point = [round(time.time() - launched, 1), first["numPartitionsMaterialized"], first["numPartitionsFailed"],
                 first["numPartitionsTargeted"]]
        if not progress or point[1:] != progress[-1][1:]:
            progress.append(point)
        if state["status"] != "REQUESTED" and finished is None:
            finished = time.time()
        current = [run for run in runs(dagster, RUN_STATES) if run["runId"] not in before]
        busy = any(run["status"] in IN_PROGRESS for run in current)
        if finished is None or busy:
            idle_since = None
        elif idle_since is None:
            idle_since = time.time()
        elif time.time() - idle_since >= quiet:
            break
    cpu_after = dagster.cpu_seconds()
    current = [run for run in runs(dagster) if run["runId"] not in before]
    last_end = max((run["endTime"] or launched) for run in current)
    of_backfill = [run for run in current if {"key": "dagster/backfill", "value": backfill_id} in run["tags"]]
    others = [run for run in current if run not in of_backfill]
    # Dagster's backfill daemon takes a new backfill up at its next iteration, every 30 s (a
    # constant, dagster#11649): 0-30 s, 15 on average for a user, up to 30 s here, where the
    # launch follows the daemon's first iteration at start-up.
    picked_up = min((run["creationTime"] for run in of_backfill), default=launched)
    return {
        "backfill_id": backfill_id,
        "status": state["status"],
        "wall_s": round(last_end - launched, 1),
        "pickup_s": round(picked_up - launched, 1),
        "after_pickup_s": round(last_end - picked_up, 1),
        "backfill_s": round(finished - launched, 1),
        "runs": len(current),
        "backfill_runs": len(of_backfill),
        "automation_runs": len(others),
        "failed_runs": sum(run["status"] == "FAILURE" for run in current),
        "failed_backfill_runs": sum(run["status"] == "FAILURE" for run in of_backfill),
        "run_seconds": sorted(round(run["endTime"] - run["startTime"], 1) for run in of_backfill
                              if run["startTime"] and run["endTime"]),
        "partitions": {key: {k: v for k, v in status.items() if k.startswith("num")} for key, status in counts.items()},
        "timeline": timeline(current, launched, of_backfill),
        # from the launch to the end of the quiet wait, by process role
        "cpu_s": {role: round(seconds - cpu_before.get(role, 0.0), 1) for role, seconds in cpu_after.items()},
        "progress": progress,
    }


def timeline(current: list[dict], launched: float, of_backfill: list[dict]) -> list[dict]:
    """Every run the backfill caused, in start order, in seconds from the launch: when it was
    created (queued), started and ended, when its steps started and ended, what it ran, and
    the idle gap before it (no run of the backfill's in progress: daemon ticks, the queue, a
    run's launch)."""
    rows, busy_until = [], launched
    for run in sorted(current, key=lambda run: run["startTime"] or run["creationTime"]):
        started, ended = run["startTime"] or run["creationTime"], run["endTime"] or run["creationTime"]
        rows.append({"job": run["jobName"], "backfill": run in of_backfill, "status": run["status"],
                     "assets": sorted("/".join(key["path"]) for key in run["assetSelection"] or [])[:12],
                     "created": round(run["creationTime"] - launched, 1), "started": round(started - launched, 1),
                     "ended": round(ended - launched, 1), "idle_before": round(max(0.0, started - busy_until), 1),
                     # the steps' own seconds: the rest of the run is its start-up (process, code load) and end
                     "steps": {step["stepKey"]: [round(step["startTime"] - launched, 1), round(step["endTime"] - launched, 1)]
                               for step in run["stepStats"] if step["startTime"] and step["endTime"]}})
        busy_until = max(busy_until, ended)
    return rows


def runs(dagster: Dagster, query: str = RUNS) -> list[dict]:
    return dagster.query(query)["runsOrError"]["results"]


def failed_partitions(home: Path, stage: str = "transcripts") -> list[str]:
    """What the asset's partition view shows failed (Dagster's status cache)."""
    import dagster as dg
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

    sys.path.insert(0, str(ROOT))
    from tkg_assets.partitions import partition_space

    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        space = partition_space(os.environ["BENCH_SOURCE"])
        value = get_and_update_asset_status_cache_value(instance, dg.AssetKey(stage), space)
        return sorted(value.deserialize_failed_partition_subsets(space).get_partition_keys()) if value else []
    finally:
        instance.dispose()


def baseline_tree(revision: str, into: Path) -> Path:
    """The files of tkg at `revision`, without touching this checkout."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def corrupt_one_call(source: Path, into: Path) -> tuple[Path, str]:
    """A copy of `source` whose newest call of the first company is no longer a transcript."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tkg.core.partitions import key_of, quarter_start

    if source.suffix == ".jsonl":
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    else:
        rows = pq.read_table(source).to_pylist()
    company = sorted({row["company"] for row in rows})[0]
    victim = max((row for row in rows if row["company"] == company), key=lambda row: str(row["date"]))
    victim["transcript"] = "This row was damaged in transit: no title, no speakers, no sections."
    from datetime import date
    called = victim["date"] if isinstance(victim["date"], date) else date.fromisoformat(str(victim["date"])[:10])
    target = into / f"damaged{source.suffix}"
    if source.suffix == ".jsonl":
        target.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), target)
    return target, key_of(company, quarter_start(called))


def extrapolate(results: dict, sizes: tuple[int, ...] = (20_000, 200_000)) -> dict:
    """On paper, from this run's measured costs: runs and hours of a backfill of `sizes`
    partitions, one per run against batched, with runs going side by side as the run queue lets
    them (one per core). A run of one partition costs `one` (the median run of per_run_1: run
    start-up plus one partition); each further partition of a batched run costs `each` (from the
    median batched run). The stage work is this run's offline work; with an LLM each partition
    costs more, the same in both columns."""
    variants = results["variants"]
    single = next((v for k, v in variants.items() if k == "per_run_1"), None)
    batched = next((v for k, v in variants.items() if k.startswith("per_run_") and k != "per_run_1"), None)
    if not single or not batched or not single["run_seconds"] or not batched["run_seconds"]:
        return {}
    per_run = int(next(k for k, v in variants.items() if v is batched).removeprefix("per_run_").split("_")[0])
    cores = results["machine"]["cpus"] or 1
    one = statistics.median(single["run_seconds"])
    targeted = batched["partitions"]["transcripts"]["numPartitionsTargeted"]
    held = targeted / max(1, batched["backfill_runs"])
    each = (statistics.median(batched["run_seconds"]) - one) / max(1.0, held - 1)
    if each <= 0:  # noise larger than the stage work (the sample): no per-partition cost to scale
        return {"note": "a batched run was no slower than a run of one partition here; the per-partition cost "
                        "is not measurable at this size (see benchmarks/README.md for the corpus-based figures)"}
    paper = {"run_of_one_partition_s": round(one, 1), "each_further_partition_s": round(each, 2),
             "runs_side_by_side": cores, "partitions_per_run": per_run}
    for size in sizes:
        runs = -(-size // per_run)
        paper[str(size)] = {
            "one_per_run": {"runs": size, "hours": round(size * one / cores / 3600, 1)},
            "batched": {"runs": runs, "hours": round((runs * one + (size - runs) * each) / cores / 3600, 1)},
        }
    return paper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="sample", help="'sample' (default) or 'corpus' (the real corpus in ../shared)")
    parser.add_argument("--variants", default="50,1", help="TKG_PARTITIONS_PER_RUN values to run (default 50,1)")
    parser.add_argument("--run-workers", type=int, default=1, help="TKG_RUN_WORKERS of the variants (default 1)")
    parser.add_argument("--executor", help="TKG_EXECUTOR of the variants (default: unset, multiprocess)")
    parser.add_argument("--baseline", help="a git revision of tkg to backfill with too, at its own defaults")
    parser.add_argument("--fail-one", action="store_true", help="also: one partition made to fail, then re-executed")
    parser.add_argument("--quiet", type=float, default=75.0,
                        help="seconds with no run in progress that end a backfill (the sensor ticks every 5)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the data folders")
    parser.add_argument("--extrapolate-from", type=Path, help="only add the on-paper figures to a results file")
    args = parser.parse_args()
    if args.extrapolate_from:
        results = json.loads(args.extrapolate_from.read_text())
        results["on_paper"] = extrapolate(results)
        args.extrapolate_from.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps(results["on_paper"], indent=1))
        return
    if args.source == "corpus":
        if not CORPUS.exists():
            print(f"SKIPPED: the real corpus is not at {CORPUS}")
            return
        source = str(CORPUS)
    else:
        source = args.source
    os.environ["BENCH_SOURCE"] = source
    sys.path.insert(0, str(ROOT))
    out = args.out or ROOT / "benchmarks" / "results" / f"backfill_{'corpus' if source == str(CORPUS) else 'sample'}.json"
    scratch = Path(tempfile.mkdtemp(prefix="bench_backfill_"))
    results: dict = {"source": args.source, "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
                     "variants": {}}
    try:
        build_home = scratch / "build"
        wall, cpu = tkg_build(source, build_home)
        results["tkg_build_s"], results["tkg_build_cpu_s"] = round(wall, 1), round(cpu, 1)
        print(f"tkg build: {results['tkg_build_s']} s, {results['tkg_build_cpu_s']} CPU-s", flush=True)
        reference = published(build_home)
        params = {"assetSelection": [{"path": [name]} for name in PARTITIONED], "allPartitions": True}
        variants: list[tuple[str, Path, dict]] = [
            (f"per_run_{value}" + (f"_{args.executor}" if args.executor else ""), ROOT,
             {"TKG_PARTITIONS_PER_RUN": value, "TKG_RUN_WORKERS": str(args.run_workers),
              **({"TKG_EXECUTOR": args.executor} if args.executor else {})})
            for value in args.variants.split(",") if value]
        if args.baseline:
            variants.append((f"baseline_{args.baseline}", baseline_tree(args.baseline, scratch / "baseline"), {}))
        for label, code, env in variants:
            home = scratch / label
            dagster = Dagster(code, home, source, env)
            try:
                outcome = backfill(dagster, params, args.quiet)
            finally:
                dagster.stop()
            outcome["differences_from_tkg_build"] = differences(home, reference)
            outcome["vs_tkg_build"] = round(outcome["wall_s"] / results["tkg_build_s"], 2)
            outcome["vs_tkg_build_after_pickup"] = round(outcome["after_pickup_s"] / results["tkg_build_s"], 2)
            results["variants"][label] = outcome
            print(f"{label}: {json.dumps({k: v for k, v in outcome.items() if k != 'progress'})}", flush=True)
        if args.fail_one:
            results["fail_one"] = fail_one(source, scratch, args, params, reference)
            print(f"fail_one: {json.dumps(results['fail_one'])}", flush=True)
        results["on_paper"] = extrapolate(results)
    finally:
        results["machine"]["load_after"] = os.getloadavg()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"written {out}")
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


def fail_one(source: str, scratch: Path, args, params: dict, reference: dict) -> dict:
    """Backfill with one damaged call, then restore it and re-execute the failed partitions."""
    from tkg.ingest.sources import source_path

    original = source_path(source)
    folder = scratch / "fail_one_source"
    folder.mkdir()
    damaged, victim = corrupt_one_call(original, folder)
    live = folder / f"transcripts{original.suffix}"  # the file the code location reads, damaged then restored
    shutil.copy(damaged, live)
    home = scratch / "fail_one"
    value = args.variants.split(",")[0]
    dagster = Dagster(ROOT, home, str(live), {"TKG_PARTITIONS_PER_RUN": value, "TKG_RUN_WORKERS": str(args.run_workers),
                                              **({"TKG_EXECUTOR": args.executor} if args.executor else {})})
    try:
        first = backfill(dagster, params, args.quiet)
        failed_first = failed_partitions(home)
        shutil.copy(original, live)
        # the code location reads the source when it loads: reload it, as the UI's *Reload* does
        dagster.query('mutation { reloadRepositoryLocation(repositoryLocationName: "tkg") '
                      "{ __typename } }")
        retry = backfill(dagster, {"parentRunId": first["backfill_id"], "strategy": "FROM_FAILURE"}, args.quiet,
                         mutation=REEXECUTE)
        failed_after = failed_partitions(home)
    finally:
        dagster.stop()
    return {"victim": victim, "first": {k: v for k, v in first.items() if k != "progress"},
            "failed_partitions_after_first": failed_first, "retry": {k: v for k, v in retry.items() if k != "progress"},
            "failed_partitions_after_retry": failed_after, "differences_from_tkg_build": differences(home, reference)}


if __name__ == "__main__":
    main()
