"""`tkg build` on the full corpus, offline: cold, no-op and one-new-call, and where the time goes.

    python benchmarks/bench_build.py                      # 3 cold builds, 5 no-ops, 1 new call
    python benchmarks/bench_build.py --runs 3 --baseline 740f9ce   # also the tkg of that commit, side by side

With --baseline, each cold build of this tree is followed by a cold build of the baseline, so
the two medians come from the same stretch of machine time.

Each build is the real CLI in a subprocess with a fresh data folder. The "cold" source is the
corpus without its newest call; the one-new-call build then adds that call back, which must
rebuild one partition and the global steps. Every figure is a median over the runs of this
invocation; tkg's own share comes from the `last_build.json` each build writes (stage work
summed over the worker processes, and each global step's time from Dagster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TKG_SHARED", ROOT.parent / "shared")) / "data" / "earnings_calls" / "transcripts.parquet"


def tkg(command: list[str], home: Path, cwd: Path = ROOT) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TKG_LLM", "DAGSTER_HOME")}
    env["TKG_HOME"] = str(home)
    env["PYTHONPATH"] = str(cwd)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "tkg.cli", *command], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"tkg {' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return elapsed, completed


def record(home: Path) -> dict:
    return json.loads((home / "last_build.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="cold builds (default 3)")
    parser.add_argument("--noops", type=int, default=5, help="no-op rebuilds (default 5)")
    parser.add_argument("--baseline", help="a git revision of tkg to build the same corpus with, side by side")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "build.json")
    args = parser.parse_args()
    if not CORPUS.exists():
        raise SystemExit(f"the real corpus is not at {CORPUS}; set TKG_SHARED to the folder holding data/earnings_calls")

    work = Path(tempfile.mkdtemp(prefix="tkg-bench-build-"))
    table = pq.read_table(CORPUS)
    newest = pc.index(table["date"], pc.max(table["date"])).as_py()
    without = table.take([row for row in range(table.num_rows) if row != newest])
    cold_source = work / "corpus_without_newest.parquet"
    pq.write_table(without, cold_source)
    added = f"{table['company'][newest].as_py()} {table['date'][newest].as_py()}"
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "corpus_calls": table.num_rows,
                     "new_call": added, "cold": [], "noop": [], "one_new_call": None, "baseline": None,
               "load_average_before": os.getloadavg()}

    tree = work / "baseline"
    if args.baseline:
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.baseline], cwd=ROOT, check=True,
                       capture_output=True)
        results["baseline"] = {"revision": args.baseline, "cold": []}
    try:
        for run in range(args.runs):
            home = work / f"cold{run}"
            seconds, _ = tkg(["build", "--source", str(cold_source)], home)
            results["cold"].append({"seconds": round(seconds, 2), "record": record(home)})
            print(f"cold build {run + 1}: {seconds:.1f} s", flush=True)
            if args.baseline:
                baseline_home = work / f"baseline{run}"
                seconds, _ = tkg(["build", "--source", str(cold_source)], baseline_home, cwd=tree)
                results["baseline"]["cold"].append({"seconds": round(seconds, 2), "record": record(baseline_home)})
                print(f"baseline {args.baseline} cold build {run + 1}: {seconds:.1f} s", flush=True)
    finally:
        if args.baseline:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    home = work / f"cold{args.runs - 1}"
    seconds, completed = tkg(["build", "--source", str(CORPUS)], home)
    assert "building 1 of 187 partition(s)" in completed.stderr, completed.stderr[-2000:]
    results["one_new_call"] = {"seconds": round(seconds, 2), "record": record(home)}
    print(f"one new call ({added}): {seconds:.1f} s", flush=True)
    for run in range(args.noops):
        seconds, completed = tkg(["build", "--source", str(CORPUS)], home)
        assert "up to date" in completed.stderr
        results["noop"].append(round(seconds, 2))
    print(f"no-op rebuilds: {results['noop']}", flush=True)

    results["load_average_after"] = os.getloadavg()
    cold = statistics.median(entry["seconds"] for entry in results["cold"])
    noop = statistics.median(results["noop"])
    middle = sorted(results["cold"], key=lambda entry: entry["seconds"])[len(results["cold"]) // 2]["record"]
    partitions_wall = middle["seconds"]["partitions"]
    results["summary"] = {
        "cold_median_s": cold, "noop_median_s": noop, "noop_share_of_cold": round(noop / cold, 4),
        "one_new_call_s": results["one_new_call"]["seconds"],
        "cold_split_s": {**middle["seconds"], "stage_work_cpu": middle["stage_seconds"], "workers": middle["workers"],
                         "partitions_wall_minus_stage_work_per_worker":
                             round(partitions_wall - middle["stage_seconds"] / middle["workers"], 2),
                         "global_steps": middle["global_steps"]},
    }
    if results["baseline"]:
        baseline = statistics.median(entry["seconds"] for entry in results["baseline"]["cold"])
        middle_baseline = sorted(results["baseline"]["cold"], key=lambda e: e["seconds"])[args.runs // 2]["record"]
        results["summary"].update(baseline_cold_median_s=baseline, cold_over_baseline_cold=round(cold / baseline, 3),
                                  baseline_stage_work_cpu=middle_baseline["stage_seconds"],
                                  baseline_global_steps=middle_baseline["global_steps"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
