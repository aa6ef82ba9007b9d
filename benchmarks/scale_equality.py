"""Check, on a store `bench_scale.py --keep` left: the global half built one quarter at a time,
taken back a quarter, or stopped by `kill -9` and run again, equals a cold build of the same
partitions.

    python benchmarks/scale_equality.py --store /tmp/tkg_bench_scale/events_1000000 --shards 8 \
        [--increment-companies N] [--kill 25,50,75] [--kill-back 40,65]

From the store's partitions alone (its global steps' outputs left out) it builds, each in a
folder of hard links, every pass as one `refresh_and_publish` run does it (bench_scale.py's
`--worker-pass`, publish included):
- `before`: the newest quarter (of `--increment-companies` companies, or all) held back, cold;
- `after`: every partition, cold: the reference for the increments;
- `increment`: `before` with the quarter added; then `taken back`: the quarter held back
  again, whose versions come back (compared with `before`);
- per `--kill` second: `before` with the quarter added, its pass killed (SIGKILL to its process
  group) that many seconds in, then run again; per `--kill-back` second, the same for taking
  the quarter back.
Compared: each global table's rows (canonical entities: the live ones), each shard's rows of
each split table and the splitting steps' fingerprints, each shard's stacked ranks and its
judgments, retirements and memo tables, as a row count and a sum of row hashes (so row order
is not compared). Results: benchmarks/results/scale_equality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_scale
from bench_resolution_invalidation import machine

RESULTS = HERE / "results" / "scale_equality.json"
GLOBAL_TABLES = [("canonical_entities", "canonical_entities"), ("canonical_entities", "entity_resolution"),
                 ("spoken_mentions", "spoken_mentions"), ("invalidated_events", "event_invalidations"),
                 ("invalidated_events", "invalidation_judgments"), ("invalidated_events", "figure_invalidations"),
                 ("fact_relevance", "fact_relevance")]
SHARD_TABLES = [("candidate_ranks", "ranked_members"), ("judged_pairs", "retirements"),
                ("judged_pairs", "paired_events"), ("judged_pairs", "paired_units")]


def linked(source: Path, target: Path, partitions_only: bool = False) -> Path:
    """A copy of a store of hard links (tkg replaces its files, never writes into them), the
    published file copied (a publish updates it in place); its partitions alone if asked."""
    source = source.resolve()
    shutil.rmtree(target, ignore_errors=True)
    global_steps = {stage.name for stage in bench_scale._global_stages()} | {"_manifest", "_packs", "llm_calls"}

    def ignored(folder: str, names: list[str]) -> list[str]:
        inside = Path(folder)
        ignore = ["tmp", "tkg.duckdb"] if inside == source else []
        if partitions_only and inside == source / "parquet":
            ignore += [name for name in names if name in global_steps]
        return ignore

    shutil.copytree(source, target, copy_function=os.link, ignore=ignored)
    if not partitions_only and (source / "tkg.duckdb").exists():
        shutil.copy2(source / "tkg.duckdb", target / "tkg.duckdb")
    return target


def run_pass(root: Path, shards: int, kill_after: float | None = None) -> dict:
    """One pass of the global half and the publish; killed after `kill_after` seconds if given."""
    command = [sys.executable, str(HERE / "bench_scale.py"), "--worker-pass", "--store", str(root), "--shards", str(shards)]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    if kill_after is not None:
        try:
            child.wait(kill_after)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return {"killed_after_s": kill_after, "finished_first": child.returncode == 0}
    output, _ = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the pass over {root} failed: {output.strip()[-2000:]}")
    report = json.loads(output.strip().splitlines()[-1])
    return {"wall_s": round(time.perf_counter() - started, 1),
            "cpu_s": round(sum(step["cpu_s"] for step in report["steps"].values()), 1)}


def digests(root: Path, shards: int) -> dict[str, object]:
    """What is compared (see the module docstring), by name: (rows, sum of row hashes), or a
    splitting step's fingerprints."""
    import duckdb

    from tkg.build import catalog
    from tkg.invalidate.stages import stack_judgments, stack_ranks
    from tkg.store.parquet import ParquetStore
    store = ParquetStore(root)
    found: dict[str, object] = {}
    with duckdb.connect() as connection:

        def digest(relation) -> tuple[int, int]:
            return row_digest(connection, relation)

        for stage, table in GLOBAL_TABLES:
            rows = store.relation(connection, [store.global_path(stage, table)])
            if table == "canonical_entities":
                rows = rows.filter("merged_into IS NULL AND mention_count > 0")
            found[f"{stage}.{table}"] = digest(rows)
        keys = catalog.shard_keys(shards)
        for stage in catalog.GLOBAL:
            if stage.shard_tables:
                found.update(split_digests(store, connection, stage, keys))
        for shard in keys:
            stack_ranks(store, connection, [shard], "stacked_ranks", "scale_equality")
            found[f"candidate_ranks/{shard}/stacked"] = digest(connection.table("stacked_ranks"))
            stack_judgments(store, connection, [shard], "stacked_judgments", "scale_equality")
            found[f"judged_pairs/{shard}/judgments"] = digest(connection.table("stacked_judgments"))
            for stage, table in SHARD_TABLES:
                found[f"{stage}/{shard}/{table}"] = digest(store.relation(connection, [store.shard_path(stage, shard, table)]))
    return found


def row_digest(connection, relation) -> tuple[int, int]:
    """A relation's row count and sum of row hashes: equal for the same rows in any order."""
    relation.create_view("compared", replace=True)
    columns = ", ".join(f'"{name}"' for name in relation.columns)
    rows, total = connection.execute(f"SELECT count(*), sum(hash({columns})::HUGEINT) FROM compared").fetchall()[0]
    return rows, int(total or 0)


def split_digests(store, connection, stage, keys: list[str]) -> dict[str, object]:
    """A splitting step's shard fingerprints, and (rows, sum of row hashes) of each table's rows
    in each shard, as a reader stacks them (however many segments they are stored in)."""
    from tkg.store.splits import shard_rows

    stamp = store.stamp(store.global_path(stage.name))
    found: dict[str, object] = {f"{stage.name} fingerprints": stamp.parts}
    for table in stage.shard_tables:
        for shard in keys:
            rows = shard_rows(store, connection, stage.name, stamp.version, table.name, shard, table.schema.names)
            found[f"{stage.name}/{table.name}/{shard}"] = None if rows is None else row_digest(connection, rows)
    return found


def compared(root: Path, reference: dict[str, object], shards: int) -> dict:
    now = digests(root, shards)
    differing = sorted(name for name in reference.keys() | now.keys() if reference.get(name) != now.get(name))
    return {"items_compared": len(reference), "differing": differing, "equal": not differing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="a store bench_scale.py kept (--keep)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--increment-companies", type=int, help="add the newest quarter of this many companies (default: all)")
    parser.add_argument("--kill", default="", help="seconds into the quarter's pass to kill it at, comma-separated")
    parser.add_argument("--kill-back", default="", help="the same, for taking the quarter back")
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tkg_scale_equality")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not (args.store / "parquet" / "temporal_events").is_dir():
        print(f"SKIPPED: no store at {args.store} (run bench_scale.py --keep first)")
        return 0

    def log(message: str) -> None:
        print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)

    work = args.workdir
    base = linked(args.store, work / "partitions", partitions_only=True)
    if (base / bench_scale.HELD_BACK).exists():
        bench_scale.bring_back(base)
    held = bench_scale.hold_back(base, bench_scale._newest_quarter(base), args.increment_companies)
    log(f"held back {held}")
    report = {"benchmark": "the global half built incrementally, taken back and killed, against cold builds",
              "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "command": "python benchmarks/scale_equality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "tkg_revision": bench_scale.tkg_revision(), "store": str(args.store),
              "shards": args.shards, "held_back": held, "passes": {}, "checks": {}}

    def check(name: str, root: Path, reference: dict) -> None:
        report["checks"][name] = compared(root, reference, args.shards)
        log(f"{name}: {'equal' if report['checks'][name]['equal'] else 'DIFFERENT: ' + ', '.join(report['checks'][name]['differing'][:8])}")

    before = linked(base, work / "before")
    report["passes"]["before cold"] = run_pass(before, args.shards)
    after = linked(base, work / "after")
    bench_scale.bring_back(after)
    report["passes"]["after cold"] = run_pass(after, args.shards)
    reference = {"before": digests(before, args.shards), "after": digests(after, args.shards)}
    log(f"cold builds: {report['passes']}")

    increment = linked(before, work / "increment")
    bench_scale.bring_back(increment)
    report["passes"]["the quarter"] = run_pass(increment, args.shards)
    check("the quarter, incremental, against a cold build", increment, reference["after"])
    quarter_done = linked(increment, work / "quarter_done")
    bench_scale.hold_back(increment, bench_scale._newest_quarter(increment), args.increment_companies)
    report["passes"]["the quarter taken back"] = run_pass(increment, args.shards)
    check("the quarter taken back, against a cold build without it", increment, reference["before"])

    for seconds in [float(s) for s in args.kill.split(",") if s.strip()]:
        killed = linked(before, work / f"killed_{seconds:g}")
        bench_scale.bring_back(killed)
        report["passes"][f"the quarter killed at {seconds:g} s"] = run_pass(killed, args.shards, kill_after=seconds)
        report["passes"][f"the quarter killed at {seconds:g} s, run again"] = run_pass(killed, args.shards)
        check(f"the quarter killed at {seconds:g} s and run again, against a cold build", killed, reference["after"])
        shutil.rmtree(killed)
    for seconds in [float(s) for s in args.kill_back.split(",") if s.strip()]:
        killed = linked(quarter_done, work / f"killed_back_{seconds:g}")
        bench_scale.hold_back(killed, bench_scale._newest_quarter(killed), args.increment_companies)
        report["passes"][f"taken back, killed at {seconds:g} s"] = run_pass(killed, args.shards, kill_after=seconds)
        report["passes"][f"taken back, killed at {seconds:g} s, run again"] = run_pass(killed, args.shards)
        check(f"the quarter taken back, killed at {seconds:g} s and run again, against a cold build", killed, reference["before"])
        shutil.rmtree(killed)
    report["all_equal"] = all(result["equal"] for result in report["checks"].values())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({name: result["equal"] for name, result in report["checks"].items()}, indent=2))
    print(f"Results: {args.output}")
    return 0 if report["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
