"""Benchmark: one step of the global half alone, this tree against another, on the same store state.

A change to one step (`fact_blocks`, `candidate_ranks`, `judged_pairs`) moves the whole pass by
a few percent, less than a pass varies on a shared machine. This times the step alone: the
store is left just before the step (e.g. a quarter's pass stopped there), the step's folder is
kept as hard links (tkg replaces a file it writes, never writes into one), and each round runs
the step (over every shard, for a shard step) once with this tree's Python and once with the
other tree's, the folder restored before each run. DuckDB runs on one thread, so a shard's CPU
time is its own. At the end, the last two runs' outputs (both trees, same input) are compared
table by table and shard by shard: row counts and sums of row hashes (of a global step that
splits its tables by shard, each shard's rows as a reader stacks them, and its fingerprints).

    python benchmarks/step_alone.py --store STORE --shards 32 --step judged_pairs \\
        --baseline-python OTHER_TREE/.venv/bin/python --rounds 3 [--baseline-store OTHER_STORE]

STORE is a data folder whose steps before `--step` are current and `--step` is stale (one a
`bench_scale.py --keep` run left, its quarter brought back and the steps before run). The
baseline interpreter must have the other tree installed (e.g. a clone with its own venv); it
runs this file, and imports tkg from its own install. A change to what the step stores (e.g.
its judgments as changes on a base) needs each tree's own last output of the step: then
OTHER_STORE is the same state with the step's last output written by the other tree, and the
stacked rows are compared. Results: benchmarks/results/step_alone.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "step_alone.json"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker(store: Path, shards: int, step: str) -> int:
    """Run `step` over every shard of `store` (once, for a global step) in this process, on
    one DuckDB thread; one JSON line: CPU seconds per shard ('*' for a global step)."""
    from tkg.build import catalog
    from tkg.build.stages import Runtime, run_global
    from tkg.settings import Settings

    settings = replace(Settings.resolve(home=store, backend="offline", embeddings="wordllama", shards=shards), duckdb_threads=1)
    runtime = Runtime.open(settings)
    stage = catalog.stage(step)
    per_shard = {}
    for shard in catalog.shard_keys(shards) if stage.sharded else ["*"]:
        start = _cpu()
        run_global(runtime, stage, None if shard == "*" else shard)
        per_shard[shard] = round(_cpu() - start, 3)
    print(json.dumps({"cpu_s": round(sum(per_shard.values()), 2), "per_shard": per_shard}))
    return 0


def digests(store: Path, shards: int, step: str) -> dict[str, object]:
    """What a step's outputs are compared by: (rows, sum of row hashes) of every table file of
    every shard of a shard step, its ranks or judgments as they stack on their base (a tree
    that writes them whole has no base); a global step's tables, and the rows of each table it
    splits, by shard, with its fingerprints."""
    import duckdb

    sys.path.insert(0, str(HERE))
    from scale_equality import row_digest, split_digests

    from tkg.build import catalog
    from tkg.core import tables
    from tkg.invalidate.stages import stack_judgments, stack_ranks
    from tkg.store.parquet import ParquetStore

    stage, folder, parquet = catalog.stage(step), store / "parquet" / step, ParquetStore(store)
    stacked = {"candidate_ranks": ("rank_base", stack_ranks, tables.CANDIDATE_RANKS),
               "judgments": ("judgment_base", stack_judgments, tables.SHARD_JUDGMENTS)}
    # left out: the bases (files named by run), the versions a shard read (named by code version),
    # and the figure revisions' memo (which a tree before session 64 neither writes nor removes)
    bases = {base for base, _, _ in stacked.values()} | {"versions_read", "revision_figures"}
    with duckdb.connect() as connection:

        def rows(path: Path):
            if path.stem in stacked and stage.sharded:
                base, stack, schema = stacked[path.stem]
                if (path.parent / f"{base}.parquet").exists():
                    stack(parquet, connection, [path.parent.name.removeprefix("shard=")], "stacked", "step_alone")
                    return connection.table("stacked").select(*schema.names)
                return connection.read_parquet(str(path)).select(*schema.names)
            relation = connection.read_parquet(str(path))
            # the version a table's changes are since names the last output, whose version
            # differs between trees whose code versions differ
            return relation.select(*(f'"{name}"' for name in relation.columns if name != "since_version"))

        pattern = "shard=*/*.parquet" if stage.sharded else "*.parquet"
        found: dict[str, object] = {f"{path.parent.name}/{path.stem}": row_digest(connection, rows(path))
                                    for path in sorted(folder.glob(pattern)) if path.stem not in bases}
        if stage.shard_tables:
            found.update(split_digests(parquet, connection, stage, catalog.shard_keys(shards)))
        return found


def _folders(store: Path, step: str) -> tuple[Path, Path]:
    """The step's folder in `store`, and where it is kept as it was before the first run."""
    return store / "parquet" / step, store / f".{step}.before"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--step", default="judged_pairs")
    parser.add_argument("--baseline-python", type=Path, help="the other tree's interpreter (omit to time this tree alone)")
    parser.add_argument("--baseline-store", type=Path,
                        help="the store the other tree runs on (default: --store), in the same state as --store but "
                             "with the step's last output written by the other tree: for a change to what the step stores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.store, args.shards, args.step)

    trees = {"this": (Path(sys.executable), args.store),
             **({"baseline": (args.baseline_python, args.baseline_store or args.store)} if args.baseline_python else {})}
    stores = sorted({store for _, store in trees.values()})
    for store in stores:
        folder, kept = _folders(store, args.step)
        if kept.exists():  # a run stopped before it restored the folder: the kept one is the state to time from
            shutil.rmtree(folder, ignore_errors=True)
        else:
            shutil.copytree(folder, kept, copy_function=os.link)
    runs: dict[str, list[float]] = {name: [] for name in trees}
    outputs = {}
    try:
        for round_number in range(1, args.rounds + 1):
            for name, (python, store) in trees.items():
                folder, kept = _folders(store, args.step)
                shutil.rmtree(folder, ignore_errors=True)
                shutil.copytree(kept, folder, copy_function=os.link)
                done = subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", "--store", str(store),
                                       "--shards", str(args.shards), "--step", args.step],
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed in round {round_number}: {done.stderr.strip()[-2000:]}")
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1])["cpu_s"])
                print(f"round {round_number} {name}: {runs[name][-1]} CPU-s", flush=True)
                if round_number == args.rounds:
                    outputs[name] = digests(store, args.shards, args.step)
    finally:
        for store in stores:
            folder, kept = _folders(store, args.step)
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(kept, folder, copy_function=os.link)
            shutil.rmtree(kept)
    baseline = outputs.get("baseline")
    different = [] if baseline is None else sorted(key for key in outputs["this"].keys() | baseline.keys()
                                                   if outputs["this"].get(key) != baseline.get(key))
    report = {"store": str(args.store), **({"baseline_store": str(args.baseline_store)} if args.baseline_store else {}),
              "shards": args.shards, "step": args.step, "rounds": runs,
              "median_cpu_s": {name: statistics.median(values) for name, values in runs.items()},
              "tables_compared": 0 if baseline is None else len(outputs["this"]), "tables_different": different}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 1 if different else 0


if __name__ == "__main__":
    raise SystemExit(main())
