"""A UI backfill of the partitioned stages, as the daemon runs it: partitions batched into runs,
a bad partition failed on its own while the rest land, quarters without a call settled inside
the runs, and a re-execution of the failed partitions that rebuilds only them.

The backfill goes through Dagster's own machinery in this process: the GraphQL mutations the
UI sends, the backfill daemon's iteration, and a run launcher that executes each run it is
handed, over a code location loaded from the definitions tkg builds."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import ROOT
from tkg.build import catalog
from tkg.build.catalog import GLOBAL, PARTITIONED_NAMES
from tkg.core.paths import SAMPLE_DIR
from tkg.store.checks import CHECKS
from tkg.store.warehouse import load_models
from tkg_assets.automation import refresh_request
from tkg_assets.partitions import partition_key

VICTIM = "HLIO|2024-07-01"  # the sample's HLIO call of August 2024
LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
REEXECUTE = """mutation($params: ReexecutionParams!) { reexecutePartitionBackfill(reexecutionParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def _damaged_sample(folder: Path) -> tuple[Path, str]:
    """The sample with the victim's call turned into text that is no transcript; and the original."""
    original = (SAMPLE_DIR / "transcripts.jsonl").read_text()
    rows = [json.loads(line) for line in original.splitlines() if line.strip()]
    hits = [row for row in rows if row["company"] == "HLIO" and row["date"].startswith("2024-0") and row["date"] >= "2024-07"]
    assert len(hits) == 1, "the sample changed: pick another victim"
    hits[0]["transcript"] = "A row damaged in transit: no title line, no speakers, no sections."
    source = folder / "transcripts.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source, original


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """A Dagster instance whose launched runs execute at once, and a workspace over tkg's
    definitions for the damaged sample, with five partitions per run."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    source, original = _damaged_sample(tmp_path)
    monkeypatch.setenv("TKG_PARTITIONS_PER_RUN", "5")
    location = tmp_path / "location.py"
    location.write_text(
        "import dagster as dg\n"
        "from tkg.settings import Settings\n"
        "from tkg_assets.definitions import build_definitions\n"
        f"defs = build_definitions(Settings.resolve(home={str(tmp_path / 'home')!r}, source={str(source)!r}, "
        "backend='offline', shards=2), executor=dg.in_process_executor)\n")
    (tmp_path / "instance").mkdir()
    launcher = {"module": "dagster._core.launcher.sync_in_memory_run_launcher", "class": "SyncInMemoryRunLauncher"}
    coordinator = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}  # no queue: launch now
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance"),
                              overrides={"run_launcher": launcher, "run_coordinator": coordinator}) as instance:
        target = InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(
            LoadableTargetOrigin(python_file=str(location), attribute="defs", working_directory=str(ROOT)),
            location_name="tkg"))
        with create_test_daemon_workspace_context(target, instance) as context:
            yield context, instance, source, original, tmp_path / "home"


def _mutate(context, mutation: str, params: dict) -> str:
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(context.create_request_context(), mutation, {"params": params})
    assert not result.errors, result.errors
    answer = next(iter(result.data.values()))
    assert "backfillId" in answer, answer
    return answer["backfillId"]


def _run_backfill(context, instance, backfill_id: str):
    """Iterate the backfill daemon until the backfill is finished (each launched run executes as
    it is launched)."""
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._daemon.backfill import execute_backfill_iteration

    logger = logging.getLogger("test_backfill")
    for _ in range(30):
        list(execute_backfill_iteration(context, logger))
        backfill = instance.get_backfill(backfill_id)
        if backfill.status != BulkActionStatus.REQUESTED:
            return backfill
    states = Counter(run.status.value for run in instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id})))
    raise AssertionError(f"backfill {backfill_id} still {backfill.status} after 30 daemon iterations; runs {states}")


def _tick_refresh_sensor(context, instance, timeout_s: float = 60.0) -> list:
    """Ticks of the sensor daemon (the `tkg_automation` sensor's runs execute as launched) until
    one starts runs; the runs it started. The daemon evaluates the sensor at most once per its
    minimum interval, so a tick soon after the last one is skipped, as in a running daemon."""
    from dagster._daemon.sensor import execute_sensor_iteration

    before = {run.run_id for run in instance.get_runs()}
    deadline = time.monotonic() + timeout_s
    while True:
        list(execute_sensor_iteration(context, logging.getLogger("test_backfill"), None, None))
        started = [run for run in instance.get_runs() if run.run_id not in before]
        if started or time.monotonic() > deadline:
            return started
        time.sleep(1.0)


def _failed_partitions(instance, asset: str, partitions_def) -> set[str]:
    """What the asset's partition view shows failed."""
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

    value = get_and_update_asset_status_cache_value(instance, dg.AssetKey(asset), partitions_def)
    return set(value.deserialize_failed_partition_subsets(partitions_def).get_partition_keys())


def _materialisations(instance, asset: str) -> Counter:
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=1000).records
    return Counter(record.partition_key for record in records)


def test_batched_backfill_fails_the_bad_partition_alone_and_its_retry_rebuilds_only_it(daemon):
    from dagster._core.execution.backfill import BulkActionStatus

    context, instance, source, original, home = daemon
    request = context.create_request_context()
    graph = request.asset_graph
    partitions_def = graph.get(dg.AssetKey("transcripts")).partitions_def
    every = set(partitions_def.get_partition_keys())
    with_call = {f"{row['company']}|{row['date'][:4]}-{(int(row['date'][5:7]) - 1) // 3 * 3 + 1:02d}-01"
                 for row in map(json.loads, source.read_text().splitlines())}
    assert VICTIM in with_call and len(every) > len(with_call)  # the space runs to the quarter under way

    first = _mutate(context, LAUNCH, {"assetSelection": [{"path": [name]} for name in PARTITIONED_NAMES],
                                      "allPartitions": True})
    assert isinstance(refresh_request(instance), dg.SkipReason)  # the backfill has not requested its runs yet
    backfill = _run_backfill(context, instance, first)
    assert backfill.status == BulkActionStatus.COMPLETED_FAILED

    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": first}))
    # two companies, each a range of quarters cut into runs of at most five
    per_company = -(-len(every) // 2 // 5)
    assert len(runs) == 2 * per_company
    failed = [run for run in runs if run.status == dg.DagsterRunStatus.FAILURE]
    assert len(failed) == 1 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs if run not in failed)
    bad_run = failed[0]
    held = set(partitions_def.get_partition_keys_in_range(dg.PartitionKeyRange(
        bad_run.tags["dagster/asset_partition_range_start"], bad_run.tags["dagster/asset_partition_range_end"])))
    assert VICTIM in held and len(held) > 1
    # runs that hold only quarters without a call succeed: nothing of them is failed
    only_empty = [run for run in runs if run.tags["dagster/asset_partition_range_start"] not in with_call
                  and run.tags["dagster/asset_partition_range_end"] not in with_call]
    assert only_empty and all(run.status == dg.DagsterRunStatus.SUCCESS for run in only_empty)

    # the run's log says which partitions it holds, and its failure names the victim and why
    messages = [event.user_message for event in instance.all_logs(bad_run.run_id)]
    assert any("this run holds 5 partition(s)" in message and VICTIM.split("|")[0] in message for message in messages)
    failure = next(event for event in instance.all_logs(bad_run.run_id) if event.is_dagster_event
                   and event.dagster_event.is_step_failure).dagster_event.step_failure_data.error.message
    assert "1 of 5 partition(s) failed" in failure and VICTIM in failure and "StreetEvents" in failure

    for stage in PARTITIONED_NAMES:
        assert _failed_partitions(instance, stage, partitions_def) == {VICTIM}, stage
        assert set(_materialisations(instance, stage)) == every - {VICTIM}, stage
    statuses = {status.asset_key.to_user_string(): status for status in
                instance.get_backfill(first).get_backfill_status_per_asset_key(request)}
    for stage in PARTITIONED_NAMES:  # what the backfill page counts
        counts = {status.value: count for status, count in statuses[stage].partitions_counts_by_status.items()}
        assert (counts["FAILED"], counts["MATERIALIZED"]) == (1, len(every) - 1), stage
    quiet = instance.fetch_materializations(dg.AssetKey("transcripts"), limit=1000).records
    empty = {r.partition_key for r in quiet if r.asset_materialization.metadata["dagster/row_count"].value == 0}
    assert empty == every - with_call  # quarters without a call: settled, with no rows

    # once the backfill is done, the global half and the publish run as ONE run, the sensor's
    refresh = _tick_refresh_sensor(context, instance)
    assert [(run.job_name, run.status) for run in refresh] == [("refresh_and_publish", dg.DagsterRunStatus.SUCCESS)]
    assert _published_calls(home) == with_call - {VICTIM}  # the victim kept no output: the others are published
    _assert_refreshed_once(instance, refresh[0].run_id)
    assert isinstance(refresh_request(instance), dg.SkipReason)  # nothing landed since: no second refresh

    # the row is fixed; the UI's "re-execute from failure" rebuilds the victim, and only it
    source.write_text(original)
    retry = _mutate(context, REEXECUTE, {"parentRunId": first, "strategy": "FROM_FAILURE"})
    assert _run_backfill(context, instance, retry).status == BulkActionStatus.COMPLETED_SUCCESS
    retry_runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": retry}))
    assert [run.status for run in retry_runs] == [dg.DagsterRunStatus.SUCCESS]
    for stage in PARTITIONED_NAMES:
        assert _failed_partitions(instance, stage, partitions_def) == set(), stage
        assert _materialisations(instance, stage) == Counter(every), stage  # each partition built once
    refresh = _tick_refresh_sensor(context, instance)
    assert [(run.job_name, run.status) for run in refresh] == [("refresh_and_publish", dg.DagsterRunStatus.SUCCESS)]
    assert _published_calls(home) == with_call  # healed
    _assert_refreshed_once(instance, refresh[0].run_id)


def _published_calls(home: Path) -> set[str]:
    import duckdb

    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        rows = connection.execute("SELECT DISTINCT company, quarter FROM transcripts").fetchall()
    return {str(partition_key(company, quarter)) for company, quarter in rows}


def _assert_refreshed_once(instance, run_id: str) -> None:
    """The run recorded every global step (each shard of a shard step), the warehouse with its
    checks and every SQL model, each once."""
    events = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    recorded = Counter((event.event_log_entry.dagster_event.asset_key.to_user_string(),
                        event.event_log_entry.dagster_event.partition) for event in events)
    shards = catalog.shard_keys(2)
    expected = Counter({(stage.name, shard) if stage.sharded else (stage.name, None): 1
                        for stage in GLOBAL for shard in (shards if stage.sharded else [None])})
    expected.update({("warehouse", None): 1, **{(f"sql/{model.name}", None): 1 for model in load_models()}})
    assert recorded == expected
    checks = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
    assert {event.event_log_entry.dagster_event.event_specific_data.check_name for event in checks} == \
        {check.name for check in CHECKS}


class _RecordedWaits:
    """A shutdown event for a daemon loop: records how long the loop asks to sleep and ends the
    loop after its first look."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return True

    def is_set(self) -> bool:
        return bool(self.waits)


def test_the_backfill_daemon_on_tkgs_instance_looks_for_new_backfills_every_5_seconds(tmp_path, monkeypatch):
    """Dagster's backfill daemon waits 30 s between looks (a constant, not a setting); tkg's run
    queue sets it from dagster.yaml, so a backfill launched from the UI is planned within 5 s."""
    import dagster._daemon.controller as daemon_controller
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._daemon.backfill import execute_backfill_iteration_loop

    from tkg_assets.instance import open_instance

    monkeypatch.setattr(daemon_controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", 30)  # Dagster's, restored afterwards
    instance = open_instance(tmp_path / "dagster_home")
    assert "BACKFILL" in instance.get_required_daemon_types()  # the daemon process reads the run queue here
    shutdown = _RecordedWaits()
    with WorkspaceProcessContext(instance, None) as context:
        loop = execute_backfill_iteration_loop(context, logging.getLogger("test_backfill"), shutdown)
        for _ in loop:
            if shutdown.waits:
                break
    assert shutdown.waits and 0 < shutdown.waits[0] <= 5.0, shutdown.waits


def test_a_run_waiting_for_a_pool_slot_sleeps_instead_of_spinning_a_core(tmp_path):
    """tkg's queue starts one run more than its pool has slots, so the next run of a backfill has
    loaded when a slot frees. That run waits for the slot: it must sleep while it waits, not
    loop (Dagster 1.13's executor slept 0 s between looks, a core taken from the runs that work)."""
    import threading

    from tkg_assets.instance import open_instance

    instance = open_instance(tmp_path / "dagster_home")
    config = instance.get_concurrency_config()
    assert config.run_queue_config.max_concurrent_runs == config.pool_config.default_pool_limit + 1
    assert config.pool_config.op_granularity_run_buffer == 1
    storage = instance.event_log_storage
    storage.set_concurrency_slots("tkg_test_pool", 1)
    assert storage.claim_concurrency_slot("tkg_test_pool", "a-run-holding-the-slot", "its_step").is_claimed

    @dg.op(pool="tkg_test_pool")
    def waits_for_the_slot() -> int:
        return 1

    @dg.job
    def one_step():
        waits_for_the_slot()

    held_s = 4.0
    threading.Timer(held_s, storage.free_concurrency_slot_for_step, ("a-run-holding-the-slot", "its_step")).start()
    wall, cpu = time.perf_counter(), time.process_time()
    result = one_step.execute_in_process(instance=instance)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert result.success
    assert wall >= held_s  # it did wait for the slot
    assert cpu < 0.5 * held_s, f"the waiting run used {cpu:.1f} CPU-s in {wall:.1f} s"
