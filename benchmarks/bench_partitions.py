"""What the Dagster UI costs at 20,000 and 200,000 company x quarter partitions per asset.

Issue 23, item 4. Dagster recommends at most 100,000 partitions per asset; tkg partitions by
company x calendar quarter (tkg_assets/partitions.py), so 500 companies x 40 quarters is 20,000
and 5,000 companies x 40 quarters is 200,000. For each size this builds the same partition
space tkg builds (a MultiPartitionsDefinition of a StaticPartitionsDefinition of companies and a
quarterly TimeWindowPartitionsDefinition with end_offset=1) over tkg's own partitioned stages
and their lineage (tkg.build.catalog: transcripts ... entities, each with tkg's
BackfillPolicy.multi_run(1)), plus one unpartitioned global asset behind them, loads it in a
code server the way `dagster dev` does, and measures, in-process through dagster_graphql:

- the asset page: the UI's `PartitionHealthQuery` (copied from the 1.13 webapp bundle) for
  `statements`, with a share of its partitions reported as materialised so the status ranges
  are not trivially empty;
- a one-quarter backfill launch: the UI's `launchPartitionBackfill` mutation with every
  company's key of one quarter and the ingestion + extraction assets, as the launch dialog sends
  it (assetSelection + partitionNames), until the mutation returns;
- the backfill daemon's first tick over that backfill (one run, after the timed launches):
  its wall time and the runs it submits to the (queued, never started) run queue.

Each size runs in a child process of its own so its peak RSS (ru_maxrss, the webserver side;
the code server's VmHWM is read from /proc) is its own. Wall, CPU (time.process_time of the
webserver side) and peak RSS; medians of --reps repetitions; the first repetition is the cold
one (loaders empty, as for a page opened after a restart).

    nice -n 5 python benchmarks/bench_partitions.py                 # 500 and 5,000 companies
    nice -n 5 python benchmarks/bench_partitions.py --companies 50  # a quick look

The file is also the code location the children load (`bench_defs`, sized by
TKG_BENCH_COMPANIES).
"""

import argparse
import itertools
import json
import logging
import os
import random
import resource
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
RESULTS = HERE.parent / "results" / "partitions.json"
QUARTERS = 40
# 40 quarters ending with the quarter under way (end_offset=1, as tkg's partition space).
FIRST_QUARTER = "2017-01-01"
QUERIED = "statements"
# tkg's partitioned stages (tkg.build.catalog), the ingestion and extraction groups.
PARTITIONED = ("transcripts", "chunks", "statements", "temporal_events", "triplets", "figures", "entities")

PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey primaryDimEndKey primaryDimStartTime primaryDimEndTime
            secondaryDim {
              ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
              ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
            }
          }
        }
      }
    }
  }
}
"""

# The part of the asset graph's and overview's live data (AssetNodeLiveFragment) that grows
# with the partitions: the counts on each node, for every partitioned asset at once.
PARTITION_STATS_QUERY = """
query AssetGraphPartitionStats($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys, loadMaterializations: true) {
    assetKey { path }
    partitionStats { numMaterialized numMaterializing numPartitions numFailed }
  }
}
"""

LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionKeysNotFoundError { message }
    ... on PythonError { message stack }
  }
}
"""


def tickers(n: int) -> list[str]:
    """n distinct ticker-like names (4 letters), the same for every run."""
    return ["".join(t) for t in itertools.islice(itertools.product(string.ascii_uppercase, repeat=4), n)]


def partition_space(companies: int):
    import dagster as dg

    quarters = dg.TimeWindowPartitionsDefinition(start=FIRST_QUARTER, cron_schedule="0 0 1 1,4,7,10 *", fmt="%Y-%m-%d",
                                                 end_offset=1)
    return dg.MultiPartitionsDefinition({"company": dg.StaticPartitionsDefinition(tickers(companies)),
                                         "quarter": quarters})


def bench_defs():
    """tkg's partitioned stages with their lineage and backfill policy, over a synthetic space."""
    import dagster as dg

    from tkg.build import catalog
    from tkg_assets.assets.common import PARTITIONED_BACKFILL

    space = partition_space(int(os.environ["TKG_BENCH_COMPANIES"]))
    stages = [s for s in catalog.STAGES if s.partitioned]
    assert tuple(s.name for s in stages) == PARTITIONED, [s.name for s in stages]

    def make(stage):
        @dg.asset(name=stage.name, partitions_def=space, group_name=stage.group, deps=list(stage.inputs),
                  backfill_policy=PARTITIONED_BACKFILL)
        def _asset() -> None:
            return None
        return _asset

    @dg.asset(name="canonical_entities", group_name="resolution", deps=["entities"])
    def canonical_entities() -> None:
        return None

    return dg.Definitions(assets=[make(s) for s in stages] + [canonical_entities])


def _code_server_hwm_mb() -> float | None:
    """Peak RSS of this process's children (the code server), from /proc."""
    me, best = os.getpid(), None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("PPid", "0").strip()) == me and "VmHWM" in fields:
            mb = int(fields["VmHWM"].split()[0]) / 1024
            best = mb if best is None else max(best, mb)
    return best


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)


def first_tick(context, instance, ids: list[str], submit: int) -> dict:
    """The backfill daemon's first tick over the first backfill: its plan, and a few submissions.

    Submitting a run costs about a second of wall time here (measured: 20 runs in 33 s on the
    loaded machine), so submitting 5,000 would take more than an hour. The tick is run for real
    but only the first `submit` of its planned runs are submitted; the rest of the submission
    time is their median times the runs left, reported as an estimate.
    """
    from dagster._core.execution import asset_backfill
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._daemon.backfill import execute_backfill_iteration

    # Only the first backfill is ticked; the others would be evaluated in the same tick.
    for backfill_id in ids[1:]:
        instance.update_backfill(instance.get_backfill(backfill_id).with_status(BulkActionStatus.CANCELED))
    seen: dict = {"submit_s": []}
    real_chunks, real_submit = asset_backfill._submit_runs_and_update_backfill_in_chunks, asset_backfill.submit_asset_run
    started = time.perf_counter()

    async def chunks(asset_graph_view, workspace_process_context, backfill_id, result, logger, run_tags):
        seen["planned_s"] = time.perf_counter() - started
        seen["planned_runs"] = len(result.run_requests)
        seen["assets_per_run"] = sorted({len(r.asset_selection or ()) for r in result.run_requests})
        seen["first_run_partition_tags"] = {k: v for k, v in (result.run_requests[0].tags or {}).items()
                                            if "partition" in k} if result.run_requests else None
        result = result._replace(run_requests=result.run_requests[:submit],
                                 reserved_run_ids=result.reserved_run_ids[:submit])
        return await real_chunks(asset_graph_view, workspace_process_context, backfill_id, result, logger, run_tags)

    async def timed_submit(*args, **kwargs):
        t = time.perf_counter()
        try:
            return await real_submit(*args, **kwargs)
        finally:
            seen["submit_s"].append(time.perf_counter() - t)

    asset_backfill._submit_runs_and_update_backfill_in_chunks = chunks
    asset_backfill.submit_asset_run = timed_submit
    try:
        errors, wall, cpu = _timed(lambda: [e for e in execute_backfill_iteration(
            context.process_context, logging.getLogger("bench_partitions.backfill")) if e is not None])
    finally:
        asset_backfill._submit_runs_and_update_backfill_in_chunks = real_chunks
        asset_backfill.submit_asset_run = real_submit
    if errors:
        raise SystemExit(f"backfill tick failed: {errors[0]}")
    runs = instance.get_runs()
    per_run = statistics.median(seen["submit_s"]) if seen["submit_s"] else None
    planned = seen.get("planned_runs", 0)
    return {"wall_s": wall, "cpu_s": cpu, "plan_wall_s": round(seen.get("planned_s", 0.0), 3),
            "runs_planned": planned, "runs_submitted": len(runs),
            "run_statuses": sorted({r.status.value for r in runs}),
            "assets_per_run": seen.get("assets_per_run"), "first_run_partition_tags": seen.get("first_run_partition_tags"),
            "submit_s_per_run_median": round(per_run, 3) if per_run else None,
            "all_runs_submit_estimate_s": round(per_run * planned, 1) if per_run else None,
            "rss_mb": round(_rss_mb(), 1)}


def child(companies: int, reps: int, materialized: float, tick: bool, submit: int) -> dict:
    import dagster as dg
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    out: dict = {"companies": companies, "quarters": QUARTERS, "partitions_per_asset": companies * QUARTERS,
                 "loadavg_before": os.getloadavg()}
    # The keys as plain strings, built here rather than by Dagster, so the peak RSS measured is
    # the GraphQL side's and not this script's list of 200,000 MultiPartitionKey objects.
    quarter_keys_all = partition_space(1).partitions_defs[1].partitions_def.get_partition_keys()
    assert len(quarter_keys_all) == QUARTERS, quarter_keys_all
    keys = [f"{company}|{quarter}" for quarter in quarter_keys_all for company in tickers(companies)]
    # The instance lives on tmpfs: SQLite's fsync per event on this shared disk would otherwise
    # dominate what is measured (the UI's queries, not the disk).
    with tempfile.TemporaryDirectory(prefix="bench_partitions_", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as home:
        # Queued runs are never started here (no run queue daemon): the tick's runs stay QUEUED.
        Path(home, "dagster.yaml").write_text(
            "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n"
            "telemetry:\n  enabled: false\n")
        os.environ["DAGSTER_HOME"] = home
        instance = dg.DagsterInstance.get()

        # A random share of the queried asset's partitions reported materialised: scattered
        # keys make the most status ranges, the UI's worst case short of failures.
        picked = random.Random(23).sample(keys, int(len(keys) * materialized))
        del keys
        _, wall, cpu = _timed(lambda: [instance.report_runless_asset_event(
            dg.AssetMaterialization(QUERIED, partition=k)) for k in picked])
        out["rss_mb_before_load"] = round(_rss_mb(), 1)
        out["materialized"] = {"asset": QUERIED, "partitions": len(picked), "wall_s": wall, "cpu_s": cpu}

        with define_out_of_process_context(str(HERE), "bench_defs", instance) as context:
            out["rss_mb_after_load"] = round(_rss_mb(), 1)

            page = []
            for _ in range(reps):
                context.loaders.clear()
                result, wall, cpu = _timed(lambda: execute_dagster_graphql(
                    context, PARTITION_HEALTH_QUERY, {"assetKey": {"path": [QUERIED]}}))
                node = result.data["assetNodeOrError"]
                dims = {d["name"]: len(d["partitionKeys"]) for d in node["partitionKeysByDimension"]}
                status = node["assetPartitionStatuses"]
                page.append({"wall_s": wall, "cpu_s": cpu, "rss_mb": round(_rss_mb(), 1),
                             "response_mb": round(len(json.dumps(result.data)) / 1e6, 2), "keys_by_dimension": dims,
                             "status_ranges": len(status.get("ranges", []))})
            out["asset_page"] = {"runs": page, "median_wall_s": statistics.median(r["wall_s"] for r in page),
                                 "median_cpu_s": statistics.median(r["cpu_s"] for r in page)}

            stats = []
            for _ in range(reps):
                context.loaders.clear()
                result, wall, cpu = _timed(lambda: execute_dagster_graphql(
                    context, PARTITION_STATS_QUERY, {"assetKeys": [{"path": [n]} for n in PARTITIONED]}))
                counts = {n["assetKey"]["path"][-1]: n["partitionStats"] for n in result.data["assetNodes"]}
                stats.append({"wall_s": wall, "cpu_s": cpu, "rss_mb": round(_rss_mb(), 1),
                              QUERIED: counts[QUERIED]})
            out["asset_graph_partition_stats"] = {"assets": len(PARTITIONED), "runs": stats,
                                                  "median_wall_s": statistics.median(r["wall_s"] for r in stats),
                                                  "median_cpu_s": statistics.median(r["cpu_s"] for r in stats)}

            # One quarter, every company: the last whole quarter.
            quarter = quarter_keys_all[-2]
            quarter_keys = [f"{company}|{quarter}" for company in tickers(companies)]
            assert len(quarter_keys) == companies
            selection = [{"path": [name]} for name in PARTITIONED]
            launches, ids = [], []
            for _ in range(reps):
                context.loaders.clear()
                result, wall, cpu = _timed(lambda: execute_dagster_graphql(context, LAUNCH_BACKFILL, {
                    "backfillParams": {"assetSelection": selection, "partitionNames": quarter_keys,
                                       "fromFailure": False, "tags": []}}))
                answer = result.data["launchPartitionBackfill"]
                if answer["__typename"] != "LaunchBackfillSuccess":
                    raise SystemExit(f"launch failed: {answer}")
                ids.append(answer["backfillId"])
                launches.append({"wall_s": wall, "cpu_s": cpu, "rss_mb": round(_rss_mb(), 1)})
            out["backfill_launch"] = {"quarter": quarter, "partitions": len(quarter_keys), "assets": len(selection),
                                      "runs": launches,
                                      "median_wall_s": statistics.median(r["wall_s"] for r in launches),
                                      "median_cpu_s": statistics.median(r["cpu_s"] for r in launches)}

            if tick:
                out["first_tick"] = first_tick(context, instance, ids, submit)
            out["code_server_peak_rss_mb"] = _code_server_hwm_mb()
    out["peak_rss_mb"] = round(_rss_mb(), 1)
    out["loadavg_after"] = os.getloadavg()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--companies", default="500,5000", help="comma-separated company counts (x 40 quarters)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--materialized", type=float, default=0.02, help="share of the queried asset reported built")
    parser.add_argument("--no-tick", action="store_true", help="skip the backfill daemon's first tick")
    parser.add_argument("--submit", type=int, default=25, help="runs of the first tick actually submitted")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.reps, args.materialized, not args.no_tick, args.submit)))
        return

    import dagster

    sizes = [int(c) for c in args.companies.split(",")]
    results = {"dagster": dagster.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(),
               "reps": args.reps, "materialized_share": args.materialized, "sizes": []}
    for companies in sizes:
        env = {**os.environ, "TKG_BENCH_COMPANIES": str(companies),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(HERE), "--child", str(companies), "--reps", str(args.reps),
                               "--materialized", str(args.materialized),
                               "--submit", str(args.submit)] + (["--no-tick"] if args.no_tick else []),
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"{companies} companies: child failed ({done.returncode})")
        # The code server shares the child's stdout; the result is the line that is a JSON object.
        size = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith('{"companies"')))
        size["child_wall_s"] = round(time.perf_counter() - started, 1)
        results["sizes"].append(size)
        page, launch = size["asset_page"], size["backfill_launch"]
        tick = size.get("first_tick", {})
        stats = size["asset_graph_partition_stats"]
        print(f"{size['partitions_per_asset']:>7} partitions: asset page {page['median_wall_s']} s wall "
              f"({page['median_cpu_s']} s CPU, {page['runs'][0]['response_mb']} MB); partition stats of the "
              f"{stats['assets']} assets {stats['median_wall_s']} s ({stats['median_cpu_s']} s CPU); one-quarter backfill launch "
              f"{launch['median_wall_s']} s ({launch['median_cpu_s']} s CPU); first tick "
              f"{tick.get('plan_wall_s')} s to plan {tick.get('runs_planned')} runs, ~{tick.get('submit_s_per_run_median')} s "
              f"to submit each; peak RSS {size['peak_rss_mb']} MB "
              f"(code server {size['code_server_peak_rss_mb']} MB)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
