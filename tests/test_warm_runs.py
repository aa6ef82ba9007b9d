"""Runs start warm (tkg_assets/warm_runs.py): a real Dagster code server over tkg's definitions
starts a forkserver as it loads tkg's code and forks each run from it, with tkg's code, chonkie
and the local embedding model already loaded, instead of starting a new interpreter that imports
them again; a tkg run started that way builds its partition as any other run does; and a run
dies with its forkserver, after which the next run starts from a new one."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import dagster as dg

from tests.conftest import ROOT
from tests.test_safety import sample_lines, write_source

PROBE_JOB = "warm_probe"
SLEEPER_JOB = "warm_sleeper"


def _location(folder, source) -> str:
    """tkg's definitions over `source`, plus a job whose one op reports the process it runs in."""
    location = folder / "location.py"
    location.write_text(
        "import os, sys\n"
        "import dagster as dg\n"
        "from tkg.settings import Settings\n"
        "from tkg_assets.definitions import build_definitions\n"
        "def report(context):\n"
        "    context.log.info('PROCESS ' + __import__('json').dumps({'pid': os.getpid(), 'parent': os.getppid(),\n"
        "        'chonkie': 'chonkie' in sys.modules, 'model': 'wordllama' in sys.modules}))\n"
        "@dg.op\n"
        "def report_process(context):\n"
        "    report(context)\n"
        "@dg.job\n"
        f"def {PROBE_JOB}():\n"
        "    report_process()\n"
        "@dg.op\n"
        "def report_and_sleep(context):\n"
        "    report(context)\n"
        "    __import__('time').sleep(300)\n"
        "@dg.job\n"
        f"def {SLEEPER_JOB}():\n"
        "    report_and_sleep()\n"
        f"tkg = build_definitions(Settings.resolve(home={str(folder / 'home')!r}, source={str(source)!r}, backend='offline'),\n"
        "                        executor=dg.in_process_executor)\n"
        f"defs = dg.Definitions.merge(tkg, dg.Definitions(jobs=[{PROBE_JOB}, {SLEEPER_JOB}]))\n")
    return str(location)


def _launch(context, job: str, tags: dict[str, str] | None = None) -> str:
    from dagster_graphql.test.utils import execute_dagster_graphql

    mutation = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
      __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
    params = {"selector": {"repositoryLocationName": "tkg", "repositoryName": "__repository__", "jobName": job},
              "executionMetadata": {"tags": [{"key": key, "value": value} for key, value in (tags or {}).items()]}}
    result = execute_dagster_graphql(context.create_request_context(), mutation, {"params": params})
    assert not result.errors, result.errors
    answer = result.data["launchRun"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    return answer["run"]["runId"]


def _finished(instance, run_id: str, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish in {timeout_s} s")


def _reported_process(instance, run_id: str, timeout_s: float = 0.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [entry.user_message for entry in instance.all_logs(run_id) if entry.user_message.startswith("PROCESS ")]
        if lines or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    assert len(lines) == 1, lines
    return json.loads(lines[0].removeprefix("PROCESS "))


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited, not yet reaped
            return True
        time.sleep(0.2)
    return False


def _forkservers_of(pid: int) -> list[int]:
    """The forkserver processes `pid` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and "multiprocessing.forkserver" in command:
            found.append(int(entry.name))
    return found


def test_a_code_server_forks_runs_from_a_process_that_has_loaded_tkg(tmp_path):
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import GrpcServerTarget
    from dagster._grpc.server import GrpcServerProcess

    source = write_source(tmp_path / "calls.jsonl", sample_lines("QNTX")[:1])
    launcher = {"module": "dagster", "class": "DefaultRunLauncher"}  # through the code server, as tkg dev does
    coordinator = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance"),
                              overrides={"run_launcher": launcher, "run_coordinator": coordinator}) as instance:
        origin = LoadableTargetOrigin(python_file=_location(tmp_path, source), attribute="defs",
                                      working_directory=str(ROOT))
        with GrpcServerProcess(instance_ref=instance.get_ref(), location_name="tkg", loadable_target_origin=origin,
                               wait_on_exit=True, startup_timeout=120) as server:
            target = GrpcServerTarget(host="localhost", socket=server.socket, port=server.port, location_name="tkg")
            server_pid = server.server_process.pid
            forkservers = _forkservers_of(server_pid)
            assert len(forkservers) == 1, forkservers  # started with the code, before any run
            with WorkspaceProcessContext(instance, target) as context:
                probes = [_launch(context, PROBE_JOB) for _ in range(2)]
                for run_id in probes:
                    assert _finished(instance, run_id).status == dg.DagsterRunStatus.SUCCESS
                first, second = (_reported_process(instance, run_id) for run_id in probes)
                # forked from the warm process, not started by the server itself
                assert first["parent"] == second["parent"] == forkservers[0] != server_pid
                assert first["pid"] != second["pid"]
                assert first["chonkie"] and first["model"], first  # loaded before the run began

                # a tkg run started that way builds its partition
                from tkg.ingest.sources import load_source

                (company, quarter), = load_source(str(source)).partitions()
                key = f"{company}|{quarter.isoformat()}"
                run_id = _launch(context, "ingest_partition", {"dagster/partition": key,
                                                               "dagster/partition/company": company,
                                                               "dagster/partition/quarter": quarter.isoformat()})
                run = _finished(instance, run_id)
                assert run.status == dg.DagsterRunStatus.SUCCESS, [e.user_message for e in instance.all_logs(run_id)][-5:]
                event = instance.get_latest_materialization_event(dg.AssetKey("triplets"))
                assert event is not None and event.dagster_event.partition == key
                assert event.asset_materialization.metadata["dagster/row_count"].value > 0

                # a run dies with its forkserver; the next run starts from a new one
                sleeper = _launch(context, SLEEPER_JOB)
                working = _reported_process(instance, sleeper, timeout_s=120)
                assert working["parent"] == forkservers[0]
                os.kill(forkservers[0], signal.SIGKILL)
                if not _gone(working["pid"]):
                    os.kill(working["pid"], signal.SIGKILL)
                    raise AssertionError("the run outlived its forkserver")
                after = _launch(context, PROBE_JOB)
                assert _finished(instance, after).status == dg.DagsterRunStatus.SUCCESS
                assert _reported_process(instance, after)["parent"] not in (forkservers[0], server_pid)
