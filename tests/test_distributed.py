"""tkg past one machine (deploy/README.md): the Dagster instance on PostgreSQL, and partition
runs whose steps run on two Celery workers that share nothing but PostgreSQL, Redis and an S3
object store.

The services come from tests/services.py (skipped when absent, failing under CI). Every
process stands for a machine of its own: its own working folder, TKG_HOME, DAGSTER_HOME (a copy
of deploy/dagster.yaml) and temporary folder. Nothing listens or is reached beyond 127.0.0.1.

Run as a script, this module is the third machine of the Celery test: see `orchestrate`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import duckdb
import pytest

from tkg.build.catalog import PARTITIONED_NAMES as STAGES

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CODE_LOCATION = "tkg_assets.definitions"
WORKER_START_SECONDS = 120
ORCHESTRATION_SECONDS = 360

# The published tables a build on other machines must reproduce, with the columns that may
# differ: `ingested_at` is when a partition's events were ingested, a time of the build.
GRAPH = {
    "facts": "*",
    "events": "* EXCLUDE (ingested_at)",
    "triplets": "*",
    "canonical_entities": "*",
    "entity_aliases": "*",
    "invalidation_judgments": "*",
    "metrics": "*",
    "officer_tenures": "*",
}


def instance_environment(postgres, database: str, store, logs_bucket: str) -> dict[str, str]:
    """What deploy/dagster.yaml reads from the environment: the PostgreSQL credentials and the
    bucket for step logs (with the AWS variables boto3 reads)."""
    return {"DAGSTER_PG_HOST": postgres.host, "DAGSTER_PG_PORT": str(postgres.port),
            "DAGSTER_PG_USERNAME": postgres.user, "DAGSTER_PG_PASSWORD": postgres.password, "DAGSTER_PG_DB": database,
            "TKG_COMPUTE_LOGS_BUCKET": logs_bucket, **store.environment()}


def machine(folder: Path) -> dict[str, str]:
    """A folder standing for one machine: its own DAGSTER_HOME (holding deploy/dagster.yaml),
    TKG_HOME and temporary folder. Returns the variables that point there."""
    dagster_home, tkg_home, temporary = folder / "dagster_home", folder / "tkg_home", folder / "tmp"
    for path in (dagster_home, tkg_home, temporary):
        path.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEPLOY / "dagster.yaml", dagster_home / "dagster.yaml")
    return {"DAGSTER_HOME": str(dagster_home), "TKG_HOME": str(tkg_home), "TMPDIR": str(temporary)}


def process_environment(*layers: dict[str, str]) -> dict[str, str]:
    """This process's environment without any tkg, Dagster, AWS, Celery or OpenAI settings,
    with `layers` on top, and this virtualenv's scripts first on PATH (dagster-celery runs
    `celery` by name)."""
    inherited = {name: value for name, value in os.environ.items()
                 if not name.startswith(("TKG_", "DAGSTER_", "AWS_", "CELERY_", "OPENAI_"))}
    inherited["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{inherited.get('PATH', '')}"
    for layer in layers:
        inherited.update(layer)
    return inherited


def graph(path: Path) -> dict[str, list[tuple]]:
    with duckdb.connect(str(path), read_only=True) as connection:
        return {table: connection.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()
                for table, columns in GRAPH.items()}


def _tail(path: Path, characters: int = 3000) -> str:
    return path.read_text(errors="replace")[-characters:] if path.exists() else f"({path} does not exist)"


# --- (i) the Dagster instance on PostgreSQL ----------------------------------------------------

def test_a_partition_materialised_on_the_postgres_instance_is_recorded_in_postgres(tmp_path, monkeypatch, postgres_server,
                                                                                   s3_server):
    import dagster as dg

    from tkg.settings import Settings
    from tkg_assets.definitions import build_definitions

    database, logs_bucket = postgres_server.create_database("dagster"), s3_server.create_bucket("compute-logs")
    here = machine(tmp_path)
    here.pop("TMPDIR")  # this process's temporary folder is already chosen
    for name, value in {**instance_environment(postgres_server, database, s3_server, logs_bucket), **here}.items():
        monkeypatch.setenv(name, value)

    key = "HLIO|2024-01-01"
    defs = build_definitions(Settings.resolve(home=here["TKG_HOME"], source="sample", backend="offline"))
    with dg.DagsterInstance.get() as instance:
        result = defs.resolve_job_def("ingest_partition").execute_in_process(instance=instance, partition_key=key)
    assert result.success

    # A new instance, as any other process opens it: what it knows comes from PostgreSQL.
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        runs = instance.get_runs()
        assert [(run.run_id, run.status, run.tags.get("dagster/partition")) for run in runs] == [
            (result.run_id, dg.DagsterRunStatus.SUCCESS, key)]
        for stage in STAGES:
            assert instance.get_materialized_partitions(dg.AssetKey(stage)) == {key}, stage
            assert instance.get_latest_materialization_event(dg.AssetKey(stage)).run_id == result.run_id

    connection = postgres_server.connect(database)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT run_id, status FROM runs")
            assert cursor.fetchall() == [(result.run_id, "SUCCESS")]
            cursor.execute("SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
                           (result.run_id,))
            assert cursor.fetchone()[0] == len(STAGES)
    finally:
        connection.close()
    # ... and not from SQLite files in DAGSTER_HOME; the step logs went to the object store.
    assert not [path for path in Path(here["DAGSTER_HOME"]).rglob("*") if path.suffix in (".db", ".sqlite")]
    assert s3_server.keys(logs_bucket, "dagster/compute-logs/")


# --- (ii) a backfill on two Celery workers -----------------------------------------------------

@contextmanager
def celery_workers(machines: dict[str, tuple[Path, dict[str, str]]]) -> Iterator[dict[str, Path]]:
    """`dagster-celery worker start` as deploy/README.md runs it, once per (folder, environment)
    in `machines` (one step at a time here: the test machine has two cores), each in its own
    session so that stopping it stops the `celery` process it starts. Yields their logs once
    every worker is ready."""
    with ExitStack() as stopping:
        started = {}
        for name, (folder, environment) in machines.items():
            log = folder / "worker.log"
            command = [sys.executable, "-m", "dagster_celery.cli", "worker", "start", "-A", "dagster_celery.app",
                       "-y", str(DEPLOY / "celery.yaml"), "-n", name, "-i", CODE_LOCATION, "--", "--concurrency=1"]
            with open(log, "wb") as output:
                process = subprocess.Popen(command, cwd=folder, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            stopping.callback(_stop_session, process)
            started[name] = (process, log)
        deadline = time.monotonic() + WORKER_START_SECONDS
        for name, (process, log) in started.items():
            while f"{name}@" not in (text := log.read_text(errors="replace")) or " ready." not in text:
                assert process.poll() is None, f"celery worker {name} exited with {process.returncode}:\n{_tail(log)}"
                assert time.monotonic() < deadline, f"celery worker {name} not ready after {WORKER_START_SECONDS} s:\n{_tail(log)}"
                time.sleep(0.2)
        yield {name: log for name, (_, log) in started.items()}


def _stop_session(process: subprocess.Popen) -> None:
    """SIGTERM to the session `process` leads (a worker: the CLI and the `celery` it started,
    which shuts down warm; the third machine: the processes it forked), SIGKILL to what is
    left of it after 30 s."""
    for stop_signal in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, stop_signal)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            process.poll()  # reap the CLI
            if not _session_running(process.pid):
                return
            time.sleep(0.1)


def _session_running(session: int) -> bool:
    """Whether a process of `session` still runs (zombies aside: an orphaned `celery` may wait
    for a container's init that never reaps it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == session:  # state, ..., session id
            return True
    return False


def test_two_celery_workers_sharing_only_postgres_redis_and_s3_build_the_graph_a_local_build_builds(
        tmp_path, monkeypatch, postgres_server, redis_server, s3_server, sample_home):
    import dagster as dg
    from dagster._core.events import DagsterEventType

    from tkg.ingest.sources import load_source
    from tkg_assets.instance import DUCKDB_POOL, LLM_POOL

    database = postgres_server.create_database("dagster")
    bucket, logs_bucket = s3_server.create_bucket("tkg"), s3_server.create_bucket("compute-logs")
    shared = {
        **instance_environment(postgres_server, database, s3_server, logs_bucket),
        "TKG_EXECUTOR": "celery", "TKG_CELERY_BROKER": redis_server.url(0), "TKG_CELERY_BACKEND": redis_server.url(1),
        "TKG_STORAGE": f"s3://{bucket}/tkg", "TKG_DUCKDB_UPLOAD": f"s3://{bucket}/published/tkg.duckdb",
        "TKG_SOURCE": "sample", "TKG_LLM": "offline",
        # Two shards, not the default eight: each shard's files are objects in the store, read and
        # written over HTTP by every refresh, and the graph does not depend on the count, so it
        # must still equal the local build's (eight shards) below.
        "TKG_SHARDS": "2",
    }
    workers = {"worker-a": tmp_path / "worker-a", "worker-b": tmp_path / "worker-b"}
    orchestrator = tmp_path / "orchestrator"
    keys = [f"{company}|{quarter.isoformat()}" for company, quarter in load_source("sample").partitions()]
    orchestrator_environment = process_environment(shared, machine(orchestrator))
    for name in ("DAGSTER_HOME", *shared):
        monkeypatch.setenv(name, orchestrator_environment[name])

    # Once per instance, as deploy/README.md says: its tables (before many processes race to make
    # them) and its pools' limits.
    with dg.DagsterInstance.get() as instance:
        instance.event_log_storage.set_concurrency_slots(LLM_POOL, 8)
        instance.event_log_storage.set_concurrency_slots(DUCKDB_POOL, 1)

    starting = time.monotonic()
    with celery_workers({name: (folder, process_environment(shared, machine(folder)))
                         for name, folder in workers.items()}) as logs:
        started = time.monotonic()
        # In its own session: on a timeout, the processes it forked stop with it.
        third = subprocess.Popen([sys.executable, str(Path(__file__)), *keys], cwd=orchestrator, env=orchestrator_environment,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = third.communicate(timeout=ORCHESTRATION_SECONDS)
        except subprocess.TimeoutExpired:
            _stop_session(third)
            stdout, stderr = third.communicate()
        elapsed = time.monotonic() - started
    worker_logs = "\n".join(f"--- {name}:\n{_tail(log, 1500)}" for name, log in logs.items())
    assert third.returncode == 0, f"exit {third.returncode} after {elapsed:.0f} s:\n{stderr[-8000:]}\n{worker_logs}"
    runs = json.loads(stdout.strip().splitlines()[-1])
    print(f"two celery workers ready in {started - starting:.0f} s; {len(keys)} partition runs and the publish on them "
          f"in {elapsed:.0f} s")

    with dg.DagsterInstance.get() as instance:
        # Every run succeeded and every partition of every stage is recorded, in PostgreSQL.
        run_ids = [*runs["partitions"].values(), *runs["refresh_graph"]]
        assert {instance.get_run_by_id(run_id).status for run_id in run_ids} == {dg.DagsterRunStatus.SUCCESS}
        for stage in STAGES:
            assert instance.get_materialized_partitions(dg.AssetKey(stage)) == set(keys), stage
        # Every step ran in a celery worker, both workers took steps, and each shipped its steps'
        # output (captured stderr) to the bucket.
        shipped = {Path(key).stem for key in s3_server.keys(logs_bucket, "dagster/compute-logs/storage/")}
        steps_by_worker: Counter[str] = Counter()
        for run_id in run_ids:
            events = [record.dagster_event for record in instance.all_logs(run_id) if record.dagster_event is not None]
            succeeded = {event.step_key for event in events if event.event_type == DagsterEventType.STEP_SUCCESS}
            in_workers = {event.step_key: str(event.engine_event_data.metadata["Celery worker"].value).split("@")[0]
                          for event in events if event.event_type == DagsterEventType.ENGINE_EVENT
                          and "Celery worker" in event.engine_event_data.metadata}
            captured = {event.logs_captured_data.file_key for event in events
                        if event.event_type == DagsterEventType.LOGS_CAPTURED}
            assert succeeded and set(in_workers) == succeeded, (run_id, succeeded, in_workers)
            assert len(captured) == len(succeeded) and captured <= shipped, (run_id, captured, shipped)
            steps_by_worker.update(in_workers.values())
        assert set(steps_by_worker) == set(workers), steps_by_worker
        # one step per partition run (the partitioned stages are one multi-asset), then the global steps
        assert sum(steps_by_worker.values()) >= len(keys) + 1, steps_by_worker

    # The Parquet system of record is in the object store; no machine wrote Parquet to its disk.
    assert len([key for key in s3_server.keys(bucket, "tkg/") if key.endswith(".parquet")]) >= len(keys) * len(STAGES)
    assert not list(tmp_path.rglob("*.parquet"))

    # The published graph, fetched from where the publish uploaded it, is the local build's.
    published = tmp_path / "published.duckdb"
    s3_server.client().download_file(bucket, "published/tkg.duckdb", str(published))
    distributed, local = graph(published), graph(sample_home / "tkg.duckdb")
    assert distributed["facts"], "the published graph has no facts"
    for table in GRAPH:
        assert distributed[table] == local[table], f"{table} differs from the local build of the sample"


# --- the third machine -------------------------------------------------------------------------

def orchestrate(partition_keys: list[str]) -> dict:
    """What the test's third machine does (the daemon's part in a deploy): one run of
    `ingest_partition` per partition, all but the last at once, then a run of `refresh_graph`
    and one of `publish_graph`; then the last partition and both again (an increment), each on
    the celery executor, so every step runs on a worker. Each partition run is orchestrated in a
    forked process: Dagster's run set-up is not thread-safe (it reconfigures logging)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from dagster._core.definitions.reconstruct import ReconstructableRepository

    repository = ReconstructableRepository.for_module(CODE_LOCATION, "defs", working_directory=None)
    executor = repository.get_definition().get_job("ingest_partition").executor_def.name
    if executor != "celery":
        sys.exit(f"{CODE_LOCATION} runs its jobs on the {executor!r} executor although TKG_EXECUTOR=celery "
                 "(see deploy/README.md)")
    partitions, refreshes = {}, []
    # every partition but the last, the global half; then the last one, as a new quarter lands,
    # and the global half again: it reruns only the shards the new partition changed
    for batch in (partition_keys[:-1], partition_keys[-1:]):
        with ProcessPoolExecutor(len(batch), mp_context=multiprocessing.get_context("fork")) as pool:
            partitions.update(zip(batch, pool.map(_run, ["ingest_partition"] * len(batch), batch)))
        refreshes += [_run("refresh_graph"), _run("publish_graph")]
    return {"partitions": partitions, "refresh_graph": refreshes}


def _run(job_name: str, partition_key: str | None = None) -> str:
    """Run a job of the code location here (its steps go where its executor sends them);
    raise when it fails."""
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    job = ReconstructableRepository.for_module(CODE_LOCATION, "defs", working_directory=None).get_reconstructable_job(job_name)
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(job, instance, tags={"dagster/partition": partition_key} if partition_key else None)
        if not result.success:
            raise RuntimeError(f"run {result.run_id} of {job_name} ({partition_key or 'unpartitioned'}) failed:\n"
                               + "\n".join(_failures(instance, result.run_id)))
        return result.run_id


def _failures(instance, run_id: str) -> list[str]:
    """What went wrong in a run: its failure events with their errors."""
    failures = []
    for record in instance.all_logs(run_id):
        event = record.dagster_event
        data = event.event_specific_data if event is not None else None
        error = getattr(data, "error", None)
        if event is not None and (event.is_failure or error is not None):
            failures.append(f"[{event.step_key or 'run'}] {event.message}" + (f"\n{error.to_string()}" if error else ""))
    return failures


if __name__ == "__main__":
    print(json.dumps(orchestrate(sys.argv[1:])))
