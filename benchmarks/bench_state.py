"""Benchmark: what a step pays at its start to know what the store holds, as partitions grow.

Every run of a global or shard step starts by reading the stamps of the files it depends on
(tkg.build.state.read_state, through the manifests of tkg.store.manifest). A new quarter runs
every shard of the two shard steps, each in a process of its own: 64 runs at 32 shards. This
measures that start on a store `--copies` times as wide as a built one, without building it:
the partition folders of the built store are hard-linked under `--copies` company names each
(a 1M-event store of 3,179 partitions becomes one of 15,895 partitions and 111,000 files, the
shape of the 5M store), and the global and shard steps' folders are linked once.

    nice -n 5 python benchmarks/bench_state.py --store /tmp/tkg_bench_scale/events_1000000 --copies 5

`--store` is a data folder whose global steps are built (a `bench_scale.py --keep` store, or a
home after `tkg build`). Two starts are timed, each in a fresh process of its own per repeat,
once fresh (the process's first) and once warm (the manifests already parsed):
- a global step's: `read_state` over every partition and `consistent_versions`;
- a shard step's: `run_global` of shard 00 of `--stage` up to where it finds its output kept
  (or, for a tree whose shard steps read every partition, up to its refusal: the copies are
  partitions the global steps never saw).
Run it from another tree with PYTHONPATH to compare. Results: benchmarks/results/state.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_resolution_invalidation import machine, write_report

RESULTS = HERE / "results" / "state.json"
STARTS = ("shard_step", "global_step")


def widen(store: Path, target: Path, copies: int) -> dict:
    """`target`: `store`'s partitions under `copies` company names each, hard-linked, and its
    global and shard steps' folders once (no manifest: the first reader writes them)."""
    from tkg.build import catalog

    shutil.rmtree(target, ignore_errors=True)
    files = 0
    for stage in catalog.PARTITIONED:
        for company in sorted((store / "parquet" / stage.name).glob("company=*")):
            for copy in range(copies):
                shutil.copytree(company, target / "parquet" / stage.name / f"{company.name}{f'X{copy}' if copy else ''}",
                                copy_function=os.link)
            files += copies * sum(1 for _ in company.rglob("*.parquet"))
    for stage in catalog.GLOBAL:
        if (store / "parquet" / stage.name).exists():
            shutil.copytree(store / "parquet" / stage.name, target / "parquet" / stage.name, copy_function=os.link)
    return {"partition_files": files}


def worker(home: Path, shards: int, stage_name: str, start: str) -> dict:
    """One fresh process: one start (`shard_step` or `global_step`) timed twice, in CPU seconds
    of this process."""
    from bench_scale import _settings

    from tkg.build import catalog
    from tkg.build.stages import Runtime, run_global
    from tkg.build.state import consistent_versions, read_state

    runtime = Runtime.open(_settings(home, shards))
    keys = [f"{key:02d}" for key in range(shards)]
    out: dict = {}

    def timed(label: str, start) -> None:
        for moment in ("fresh", "warm"):
            began = time.process_time()
            try:
                outcome = start()
            except Exception as error:  # noqa: BLE001 - a refusal is an outcome of the start, timed as well
                outcome = f"{type(error).__name__}: {str(error)[:80]}"
            out[f"{label}_{moment}_cpu_s"] = round(time.process_time() - began, 3)
            out[f"{label}_outcome"] = outcome

    def shard_start() -> str:
        result = run_global(runtime, catalog.stage(stage_name), "00")
        return "kept" if any("kept as it is" in note for note in result.notes) else "ran"

    def global_start() -> str:
        state = read_state(runtime.store, keys)
        consistent_versions(state)
        return f"{len(state.partitions):,} partitions"

    timed(start, shard_start if start == "shard_step" else global_start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="a data folder whose global steps are built")
    parser.add_argument("--copies", type=int, default=5, help="company names per partition folder of the store")
    parser.add_argument("--shards", type=int, default=8, help="TKG_SHARDS the store was built with")
    parser.add_argument("--stage", default="judged_pairs", help="the shard step whose start is timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tkg_bench_state")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", choices=STARTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.shards, args.stage, args.start)))
        return 0
    if args.store is None or not (args.store / "parquet").is_dir():
        parser.error("--store must name a data folder with a parquet/ folder whose global steps are built")
    started = time.time()
    home = args.workdir / "home"
    layout = widen(args.store, home, args.copies)

    def run_workers() -> dict:
        """Each start in a fresh process of its own."""
        out = {}
        for start in STARTS:
            done = subprocess.run([sys.executable, __file__, "--worker", str(home), "--shards", str(args.shards),
                                   "--stage", args.stage, "--start", start], capture_output=True, text=True, check=True)
            out.update(json.loads(done.stdout.strip().splitlines()[-1]))
        return out

    began = time.perf_counter()
    first = run_workers()  # reads every footer once and writes the manifests
    layout["first_reader_wall_s"] = round(time.perf_counter() - began, 2)
    runs = [run_workers() for _ in range(args.repeats)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0] if key.endswith("_cpu_s")}
    report = {
        "benchmark": "state", "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "machine": machine(), "tkg_revision": _revision(),
        "store": str(args.store), "copies": args.copies, "shards": args.shards, "stage": args.stage, "layout": layout,
        "first_run": first, "runs": runs, "medians": medians, "total_seconds": round(time.time() - started, 1),
    }
    shutil.rmtree(args.workdir, ignore_errors=True)
    return write_report(report, args.output, render)


def _revision() -> str:
    import tkg

    done = subprocess.run(["git", "-C", str(Path(tkg.__file__).parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def render(report: dict) -> str:
    lines = [f"{report['layout']['partition_files']:,} partition files ({report['copies']} × the partitions of {report['store']}), "
             f"tkg {report['tkg_revision']}; CPU s, median of {len(report['runs'])} fresh processes",
             "| start | fresh | warm | outcome |", "|---|---:|---:|---|"]
    for label in STARTS:
        lines.append(f"| {label.replace('_', ' ')} | {report['medians'][label + '_fresh_cpu_s']} | "
                     f"{report['medians'][label + '_warm_cpu_s']} | {report['runs'][0][label + '_outcome']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
