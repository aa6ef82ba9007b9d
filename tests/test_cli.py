"""`tkg build` on the bundled sample: in one process and in workers, recorded in Dagster, and
incremental (a second build with nothing changed does nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import duckdb

from tkg.build.catalog import PARTITIONED_NAMES
from tkg.core.versions import read_stamp
from tkg.store.parquet import ParquetStore


def _build(home, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "TKG_HOME": str(home), **(env or {})}
    for name in ("OPENAI_API_KEY", "TKG_LLM", "DAGSTER_HOME"):
        environment.pop(name, None)
    return subprocess.run([sys.executable, "-m", "tkg.cli", "build", *extra], env=environment, capture_output=True,
                          text=True, timeout=600)


def _history(home) -> list[tuple]:
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        return connection.execute(
            "SELECT event_id, subject, subject_id, predicate, object_id, valid_at, invalid_at, invalidated_by FROM facts ORDER BY ALL"
        ).fetchall()


def test_workers_build_the_same_graph_record_every_partition_and_rebuild_nothing(tmp_path, sample_home):
    parallel = _build(tmp_path / "two", "--workers", "2")  # the session's sample was built in one process
    assert parallel.returncode == 0, parallel.stderr[-3000:]

    history = _history(sample_home)
    assert any(row[7] is not None for row in history)  # the sample's CFO change retires a fact
    assert _history(tmp_path / "two") == history

    # one run built every partition, one refreshed the global steps (each shard on its own
    # materialisation) and one published; Dagster holds each stage of each partition with the
    # data version stamped in its Parquet file
    home = tmp_path / "two"
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        runs = {run.job_name: run for run in instance.get_runs()}
        assert set(runs) == {"build_partitions", "refresh_graph", "publish_graph"}
        assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs.values())
        # launched like the UI's own runs: in tkg's code location, so the Overview timeline lists them
        assert all(run.tags.get("dagster/code_location") == "tkg" for run in runs.values())
        assert all(run.remote_job_origin.repository_origin.get_label() == "__repository__@tkg" for run in runs.values())
        store = ParquetStore(home)
        for stage in PARTITIONED_NAMES:
            key = dg.AssetKey(stage)
            assert len(instance.get_materialized_partitions(key)) == 8
            event = instance.get_latest_materialization_event(key).asset_materialization
            company, quarter = str(event.partition).split("|")
            stamp = read_stamp(store.partition_path(stage, company, quarter))
            assert event.tags["dagster/data_version"] == stamp.version
            assert event.metadata["dagster/row_count"].value >= 0
    finally:
        instance.dispose()

    again = _build(home)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "up to date" in again.stderr
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        assert len(instance.get_runs()) == 3  # no new run
    finally:
        instance.dispose()
