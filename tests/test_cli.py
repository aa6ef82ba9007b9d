"""`tkg build` on the bundled sample: one partition at a time, and in worker processes."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import duckdb


def _build(home, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TKG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home")}
    env.pop("OPENAI_API_KEY", None)
    env.pop("TKG_LLM", None)
    return subprocess.run([sys.executable, "-m", "tkg.cli", "build", *extra], env=env, capture_output=True, text=True, timeout=600)


def _history(home) -> list[tuple]:
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        return connection.execute(
            "SELECT event_id, subject_id, predicate, object_id, valid_at, invalid_at, invalidated_by FROM facts ORDER BY ALL"
        ).fetchall()


def test_workers_build_the_same_graph_and_record_every_run(tmp_path):
    sequential, parallel = _build(tmp_path / "one"), _build(tmp_path / "two", "--workers", "2")
    assert sequential.returncode == 0, sequential.stderr[-3000:]
    assert parallel.returncode == 0, parallel.stderr[-3000:]

    history = _history(tmp_path / "one")
    assert any(row[6] is not None for row in history)  # the sample's CFO change retires a fact
    assert _history(tmp_path / "two") == history

    # every partition's run is in the shared DAGSTER_HOME, as if launched from the UI
    instance = dg.DagsterInstance.from_config(str(tmp_path / "two" / "dagster_home"))
    try:
        runs = instance.get_runs(dg.RunsFilter(job_name="ingest_partition"))
        assert len(runs) == 8 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
    finally:
        instance.dispose()
