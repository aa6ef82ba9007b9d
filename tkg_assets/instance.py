"""The Dagster instance tkg runs on: where it lives, its configuration, and its housekeeping.

- `$TKG_HOME/dagster_home` unless the user points DAGSTER_HOME at their own instance.
- Its `dagster.yaml` comes from tkg's template (`tkg/config/dagster.yaml`): telemetry off, a
  run queue sized to the machine, run monitoring, and the concurrency pools.
- First-time set-up (Dagster creates its SQLite schemas on first use) happens under a file
  lock, so two builds started at once on a fresh home both succeed.
- Runs that a killed `tkg build` left STARTED are marked failed at the next start, and their
  pool slots given back, so automation, which waits while any run is in progress, resumes, and
  the next publish gets the slot the killed one held.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg

from tkg.core.machine import process_alive, usable_cores
from tkg.core.paths import CONFIG_DIR
from tkg.store.parquet import locked
from tkg_assets.assets.common import RUN_HOST_TAG, RUN_PID_TAG

TEMPLATE = CONFIG_DIR / "dagster.yaml"
MANAGED_MARKER = "# managed by tkg"


def instance_config(dagster_home: Path) -> str:
    cores = max(1, usable_cores())
    return (TEMPLATE.read_text().replace("{run_slots}", str(cores + 1)).replace("{cores}", str(cores))
            .replace("{dagster_home}", str(dagster_home)))


def prepare_dagster_home(dagster_home: Path) -> None:
    """Write tkg's instance configuration, unless the folder holds one the user wrote."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    config = dagster_home / "dagster.yaml"
    wanted = instance_config(dagster_home)
    if not config.exists() or (config.read_text().startswith(MANAGED_MARKER) and config.read_text() != wanted):
        temporary = config.with_name(f".dagster.yaml.{os.getpid()}")
        temporary.write_text(wanted)
        os.replace(temporary, config)


def open_instance(dagster_home: Path) -> dg.DagsterInstance:
    """The instance at `dagster_home`, set up under a lock so concurrent first uses do not race
    on Dagster's schema creation."""
    with locked(dagster_home.parent / f".{dagster_home.name}.lock"):
        prepare_dagster_home(dagster_home)
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        # Touch every storage now, while holding the lock: that is when the schemas are made.
        instance.get_runs(limit=1)
        instance.get_latest_materialization_event(dg.AssetKey("transcripts"))
        instance.all_instigator_state()
        # One writer of tkg.duckdb at a time (other pools get the configured default, one per core).
        if DUCKDB_POOL not in instance.event_log_storage.get_concurrency_keys():
            instance.event_log_storage.set_concurrency_slots(DUCKDB_POOL, 1)
    return instance


def run_tags() -> dict[str, str]:
    """Tags that let a later start tell whether the process running a run is still alive."""
    return {RUN_PID_TAG: str(os.getpid()), RUN_HOST_TAG: socket.gethostname()}



def fail_orphaned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the runs a killed tkg process left in progress on this host."""
    orphaned = []
    in_progress = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.NOT_STARTED,
                   dg.DagsterRunStatus.CANCELING]
    for run in instance.get_runs(dg.RunsFilter(statuses=in_progress, tags={RUN_HOST_TAG: socket.gethostname()})):
        pid = run.tags.get(RUN_PID_TAG, "")
        if pid.isdigit() and not process_alive(int(pid)):
            instance.report_run_failed(run, message=f"the tkg process running it (pid {pid}) is gone (killed?); "
                                                    "marked failed at the next start")
            orphaned.append(run.run_id)
    _free_slots_of_ended_runs(instance)
    return orphaned


def _free_slots_of_ended_runs(instance: dg.DagsterInstance) -> None:
    """Give back the pool slots (and places in a pool's queue) of runs no longer in progress.
    Dagster's daemon frees a finished run's slots, but `tkg build` runs none: a build killed
    while it published would hold the one tkg_duckdb_write slot, and every later publish would
    wait for it."""
    storage = instance.event_log_storage
    holders = set()
    for key in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(key)
        holders |= info.active_run_ids | {step.run_id for step in info.pending_steps}
    for run_id in sorted(holders):
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            storage.free_concurrency_slots_for_run(run_id)


LOCATION_NAME = "tkg"  # the code location workspace.yaml names
DUCKDB_POOL = "tkg_duckdb_write"
# The extraction steps (requests to the LLM provider) share this pool.
LLM_POOL = "tkg_llm"


def run_in_process(defs: dg.Definitions, job_name: str, instance: dg.DagsterInstance, run_config: dict,
                   tags: dict[str, str]):
    """Run a job of `defs` in this process, like `execute_in_process`, but as a run of tkg's
    code location (workspace.yaml's 'tkg'), so the UI lists it with the runs it launches
    itself (the Overview timeline shows only runs that carry a code location)."""
    import sys

    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.execution.api import create_execution_plan, execute_run
    from dagster._core.remote_origin import (
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    job = InMemoryJob(defs.resolve_job_def(job_name).as_ephemeral_job(resource_defs={}, input_values={}))
    location = ManagedGrpcPythonEnvCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name="tkg_assets.definitions",
                             working_directory=str(Path(__file__).resolve().parent.parent)),
        location_name=LOCATION_NAME)
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
    plan = create_execution_plan(job, run_config=run_config, instance_ref=instance.get_ref())
    run = instance.create_run_for_job(job_def=job.get_definition(), run_config=run_config, tags=tags, execution_plan=plan,
                                      remote_job_origin=origin)
    return execute_run(job, run, instance)


def run_failure(result, job_name: str) -> str | None:
    """None for a successful run, else the first step failure's message. A run stopped by
    Ctrl-C (Dagster records it and returns) is re-raised as KeyboardInterrupt."""
    from dagster._core.execution.plan.objects import ErrorSource

    if result.success:
        return None
    for event in result.all_events:
        data = event.step_failure_data if event.is_step_failure else None
        if data is not None and data.error_source == ErrorSource.INTERRUPT:
            raise KeyboardInterrupt
        if data is not None and data.error is not None:
            error = data.error
            while error.cause is not None and error.cls_name in ("DagsterExecutionStepExecutionError",):
                error = error.cause  # Dagster's wrapper: the user code's own error says what is wrong
            message = error.message.strip().splitlines()[0]
            return f"{event.step_key}: {message if error.cls_name in message else f'{error.cls_name}: {message}'}"
    if any(event.event_type == dg.DagsterEventType.RUN_CANCELED for event in result.all_events):
        raise KeyboardInterrupt
    return f"the {job_name} run failed; see `tkg dev` for its log"
