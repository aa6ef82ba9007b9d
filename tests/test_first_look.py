"""What a newcomer meets on the way to the graph (issue 28): the Dagster UI without its sign-up
pop-up, partitions that say why future quarters are empty, `tkg status` that remembers the source
a folder was built from, and `tkg dev` from an environment that is not activated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import run_tkg
from tests.services import free_port
from tests.test_safety import sample_lines, write_source


def test_the_instance_turns_the_sign_up_pop_up_off(tmp_path):
    from tkg_assets.instance import open_instance

    instance = open_instance(tmp_path / "dagster_home")
    try:
        assert instance.nux_enabled is False
        assert instance.telemetry_enabled is False
    finally:
        instance.dispose()


def test_partitioned_assets_say_why_later_quarters_are_empty():
    from tkg.settings import Settings
    from tkg_assets.definitions import build_definitions

    graph = build_definitions(Settings.resolve(home=Path("/nonexistent-tkg-home"))).resolve_asset_graph()
    import dagster as dg

    partitioned = [graph.get(key) for key in graph.get_all_asset_keys()
                   if isinstance(graph.get(key).partitions_def, dg.MultiPartitionsDefinition)]
    assert partitioned
    for node in partitioned:
        assert "Quarters after the source's last call stand empty" in node.description, node.key


def test_status_and_build_remember_the_source_a_folder_was_built_from(tmp_path):
    home = tmp_path / "home"
    lines = sample_lines("QNTX")[:2]  # two calls: the bundled sample has eight
    source = write_source(tmp_path / "calls.jsonl", lines)
    built = run_tkg(home, "build", "--source", str(source))
    assert built.returncode == 0, built.stderr[-3000:]
    assert json.loads((home / "built_from.json").read_text())["source"] == str(source.resolve())

    status = run_tkg(home, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    report = json.loads(status.stdout)
    assert report["graph"] == "up to date"
    assert [p["state"] for p in report["partitions"]] == ["built"] * len(lines)
    assert "calls.jsonl" in report["source"]

    again = run_tkg(home, "build")
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr[-2000:]
    # an explicit --source still wins: the bundled sample has partitions this folder never built
    sample = json.loads(run_tkg(home, "status", "--json", "--source", "sample").stdout)
    assert any(p["state"] == "missing" for p in sample["partitions"])


def test_dev_finds_dagster_beside_python_without_an_activated_environment(tmp_path):
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "DAGSTER_HOME")}
    environment.update(PATH="/usr/bin:/bin", TKG_HOME=str(tmp_path / "home"))
    assert Path(sys.executable).parent.as_posix() not in environment["PATH"].split(":")
    process = subprocess.Popen([sys.executable, "-m", "tkg.cli", "dev", "--port", str(port)], env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               cwd=tmp_path)
    try:
        deadline, answer = time.monotonic() + 300, None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", method="POST",
                                                 data=json.dumps({"query": "{ shouldShowNux }"}).encode(),
                                                 headers={"Content-Type": "application/json"})
                answer = json.loads(urllib.request.urlopen(request, timeout=5).read())
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                time.sleep(1)
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert answer == {"data": {"shouldShowNux": False}}, answer
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # dg dev and the Dagster processes it started
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
