"""Automation: the weekly schedule asks only for what is stale, in batched runs, and the
`tkg_automation` sensor asks for one refresh of the global half once partitions have landed and
nothing is running (the refresh itself, through the daemon, is in tests/test_backfill.py)."""

from __future__ import annotations

from datetime import date

import dagster as dg

from tests.conftest import offline_runtime
from tkg.build.catalog import PARTITIONED_NAMES
from tkg.ingest.sources import load_source
from tkg_assets.automation import refresh_request, stale_partition_requests
from tkg_assets.batch import refresh_and_publish
from tkg_assets.partitions import partition_key

PARTITION_STEPS = list(PARTITIONED_NAMES)


def test_schedule_requests_only_what_is_stale(tmp_path):
    from tkg.build.plan import plan_build
    from tkg.build.stages import build_partition

    source = load_source("sample")
    runtime = offline_runtime(tmp_path)
    store = runtime.store
    built = [("HLIO", date(2024, 1, 1)), ("QNTX", date(2024, 1, 1))]
    for partition in built:
        build_partition(runtime, partition, {"transcripts"}, source.rows_for(*partition))

    def requests(code_versions, per_run=50):
        plan = plan_build(store, source, source.partitions(), code_versions)
        return [request.run_config["ops"]["build_stale_partitions"]["config"]
                for request in stale_partition_requests(plan, per_run, workers=2)]

    def stages(runs):
        return {key: stages for run in runs for key, stages in run["stages"].items()}

    fresh = requests(runtime.code_versions)
    # one run per company (the sample: two), as a UI backfill groups them
    assert [{key.split("|")[0] for key in run["stages"]} for run in fresh] == [{"HLIO"}, {"QNTX"}]
    assert len(stages(fresh)) == 6 and not {str(partition_key(*p)) for p in built} & set(stages(fresh))
    assert all(list(run["stages"])[0].endswith("2024-04-01") for run in fresh)  # oldest first
    assert all(stage_list == sorted(PARTITION_STEPS) for stage_list in stages(fresh).values())
    assert all(run["workers"] == 2 and set(run["reasons"]) == set(run["stages"]) for run in fresh)
    # at most TKG_PARTITIONS_PER_RUN partitions a run
    assert [len(run["stages"]) for run in requests(runtime.code_versions, per_run=2)] == [2, 2, 1, 1]
    # a new triplet prompt: every partition again, but only triplets and what reads them
    changed = stages(requests({**runtime.code_versions, "triplets": "another-prompt"}))
    assert changed[str(partition_key(*built[0]))] == ["entities", "triplets"]
    # the same stale work asks with the same run keys, so a tick never repeats a pending request
    plan = plan_build(store, source, source.partitions(), runtime.code_versions)
    assert [r.run_key for r in stale_partition_requests(plan, 50, 2)] == [r.run_key for r in stale_partition_requests(plan, 50, 2)]


def test_the_refresh_is_asked_for_once_partitions_have_landed_and_nothing_runs():
    key = str(partition_key("HLIO", date(2024, 7, 1)))
    with dg.instance_for_test() as instance:
        assert isinstance(refresh_request(instance), dg.SkipReason)  # nothing built yet
        for asset in PARTITION_STEPS:
            instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=asset, partition=key))
        first = refresh_request(instance)
        assert isinstance(first, dg.RunRequest)
        # while a run is not finished (another partition, or the refresh itself), it waits
        queued = instance.create_run_for_job(refresh_and_publish, status=dg.DagsterRunStatus.NOT_STARTED)
        assert isinstance(refresh_request(instance), dg.SkipReason)
        instance.report_run_failed(queued)
        assert refresh_request(instance).run_key == first.run_key  # the same landing: the same request
        # once published, nothing more is asked until a partition lands again
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="warehouse"))
        assert isinstance(refresh_request(instance), dg.SkipReason)
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="statements", partition=key))
        again = refresh_request(instance)
        assert isinstance(again, dg.RunRequest) and again.run_key != first.run_key




def test_the_weekly_schedule_builds_the_stale_partitions_in_batched_runs(tmp_path, monkeypatch):
    """A tick of the schedule over the sample, and its requests run as the daemon would run them:
    a company's partitions per run, at most TKG_PARTITIONS_PER_RUN, each partition recorded as a
    materialisation of every stage; the next tick finds nothing stale."""
    from resources.tkg import resources_for
    from tkg.settings import Settings
    from tkg_assets.definitions import build_definitions

    monkeypatch.setenv("TKG_PARTITIONS_PER_RUN", "3")
    settings = Settings.resolve(home=tmp_path / "home", source="sample", backend="offline", shards=2)
    loaded = build_definitions(settings, executor=dg.in_process_executor)
    schedule, job = loaded.resolve_schedule_def("weekly_new_transcripts"), loaded.resolve_job_def("build_partitions")
    with_call = {str(partition_key(*p)) for p in load_source("sample").partitions()}
    with dg.instance_for_test() as instance:
        def tick():
            context = dg.build_schedule_context(instance=instance, resources=resources_for(settings))
            return schedule.evaluate_tick(context)

        requests = tick().run_requests
        held = [set(request.run_config["ops"]["build_stale_partitions"]["config"]["stages"]) for request in requests]
        assert [len(keys) for keys in held] == [3, 3, 1, 1]  # two companies of four calls, three a run
        assert all(len({key.split("|")[0] for key in keys}) == 1 for keys in held)
        assert set().union(*held) == with_call
        for request in requests:
            assert job.execute_in_process(run_config=request.run_config, instance=instance, tags=request.tags).success
        for stage in PARTITION_STEPS:
            records = instance.fetch_materializations(dg.AssetKey(stage), limit=100).records
            assert sorted(record.partition_key for record in records) == sorted(with_call), stage
        assert not tick().run_requests  # built: nothing stale
