"""Incremental builds and the CLI a user meets (issue 11): a new call rebuilds one partition, a
changed prompt only what it shapes; mistakes print one line and exit 2; status, remove, the
stock DuckDB CLI on the published file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from fakes.openai_server import OpenAICompatibleServer
from fakes.responders import PipelineResponder
from tests.conftest import run_tkg
from tests.test_safety import QNTX_FIRST_HALF, facts_digest, sample_lines, write_source
from tkg.store.warehouse import load_models


def materialised_partitions(home: Path, job_name: str = "build_partitions") -> set[str]:
    """The partitions the latest run of `job_name` recorded materialisations for."""
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    try:
        run = instance.get_runs(dg.RunsFilter(job_name=job_name), limit=1)[0]
        return {str(event.asset_materialization.partition) for event in instance.all_logs(run.run_id)
                if event.asset_materialization is not None}
    finally:
        instance.dispose()


def test_one_new_call_rebuilds_one_partition_and_nothing_else(tmp_path, sample_home):
    home = tmp_path / "home"
    lines = sample_lines()
    last = json.loads(lines[-1])
    source = write_source(tmp_path / "calls.jsonl", lines[:-1])
    assert run_tkg(home, "build", "--source", str(source)).returncode == 0
    write_source(source, lines)  # the schedule's case: the next quarter's call arrives
    again = run_tkg(home, "build", "--source", str(source))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building 1 of 8 partition(s)" in again.stderr and "(7 up to date)" in again.stderr
    assert materialised_partitions(home) == {f"{last['company']}|2024-10-01"}
    assert facts_digest(home) == facts_digest(sample_home)

    forced = run_tkg(home, "build", "--source", str(source), "--force")
    assert forced.returncode == 0 and "building 8 of 8 partition(s)" in forced.stderr
    assert facts_digest(home) == facts_digest(sample_home)


def test_a_new_model_rebuilds_only_the_stages_it_shapes(tmp_path):
    responder = PipelineResponder()
    with OpenAICompatibleServer(responder, latency_s=0.0) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "TKG_LLM_ATTEMPTS": "2"}
        home = tmp_path / "home"
        assert run_tkg(home, "build", *QNTX_FIRST_HALF, env=env).returncode == 0
        before = dict(responder.answered)
        changed = run_tkg(home, "build", *QNTX_FIRST_HALF, env={**env, "TKG_MODEL_TRIPLETS": "gpt-4.1-nano"})
        assert changed.returncode == 0, changed.stderr[-3000:]
        assert "code changed: triplets" in changed.stderr or "building 2 of 2" in changed.stderr
        asked = {schema: n - before.get(schema, 0) for schema, n in responder.answered.items() if n != before.get(schema, 0)}
        assert set(asked) == {"TripletsOut"}, asked  # statements, dates, embeddings and verdicts come from before
        instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
        try:
            run = instance.get_runs(dg.RunsFilter(job_name="build_partitions"), limit=1)[0]
            stages = {event.asset_materialization.asset_key.to_user_string() for event in instance.all_logs(run.run_id)
                      if event.asset_materialization is not None}
        finally:
            instance.dispose()
        assert stages == {"triplets", "entities"}


@pytest.mark.parametrize("args, says", [
    (["sql", "SELEC 1"], "syntax error"),
    (["build", "--source", "no/such/calls.parquet"], "does not exist"),
    (["build", "--since", "2017-31-01"], "--since '2017-31-01' is not a date"),
    (["build", "--company", "ACME"], "unknown company ACME"),
    (["build", "--source", "calls.txt"], "has suffix '.txt'"),
    (["remove", "HLIO", "2024Q5"], "is not a quarter"),
])
def test_mistakes_print_one_line_naming_the_fix_and_exit_2(tmp_path, sample_home, args, says):
    if args[0] in ("sql", "remove"):
        home = sample_home
    else:
        home = tmp_path / "home"
    if "calls.txt" in args:
        (tmp_path / "calls.txt").write_text("x")
        args = [a.replace("calls.txt", str(tmp_path / "calls.txt")) for a in args]
    completed = run_tkg(home, *args)
    assert completed.returncode == 2, completed.stderr
    errors = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and says in errors[0], completed.stderr
    assert "Traceback" not in completed.stderr
    debug = run_tkg(home, "--debug", *args)
    assert "Traceback" in debug.stderr


def test_sql_reads_without_writing_and_prints_every_row_as_csv_or_json(tmp_path, sample_home):
    before = sorted(p.name for p in sample_home.iterdir())
    csv = run_tkg(sample_home, "sql", "--format", "csv", "SELECT company, fiscal_quarter FROM transcripts ORDER BY ALL")
    assert csv.returncode == 0 and len(csv.stdout.splitlines()) == 9 and csv.stdout.startswith("company,fiscal_quarter")
    rows = json.loads(run_tkg(sample_home, "sql", "--format", "json", "SELECT company FROM transcripts").stdout)
    assert len(rows) == 8 and set(rows[0]) == {"company"}
    table = run_tkg(sample_home, "sql", "--max-rows", "0", "SELECT * FROM range(100)")
    assert table.stdout.count("│") >= 100 * 2
    assert sorted(p.name for p in sample_home.iterdir()) == before
    missing = run_tkg(tmp_path / "nowhere", "sql", "SELECT 1")
    assert missing.returncode == 2 and not (tmp_path / "nowhere").exists()


def test_help_texts_have_no_type_labels():
    for command in ([], ["build"], ["sql"], ["status"], ["remove"], ["dev"]):
        text = run_tkg(Path("."), *command, "--help").stdout
        assert "<bool>" not in text and "<str>" not in text and "<int" not in text and "<path>" not in text, text


def test_status_names_what_is_stale_and_remove_reopens_what_only_a_partition_retired(tmp_path, sample_home):
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    status = json.loads(run_tkg(home, "status", "--json").stdout)
    assert status["graph"] == "up to date" and {p["state"] for p in status["partitions"]} == {"built"}

    # Helio's Q3 and Q4 calls name Marcus Ortega as CFO; without them Dana Whitfield holds the office again.
    cfo_open = "SELECT count(*) FROM officers WHERE person = 'Dana Whitfield' AND role = 'CFO' AND invalid_at IS NULL"
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute(cfo_open).fetchone()[0] == 0
    for quarter in ("2024Q3", "2024Q4"):
        removed = run_tkg(home, "remove", "HLIO", quarter)
        assert removed.returncode == 0, removed.stderr[-3000:]
    assert "are open again" in removed.stderr and "still holds calls of HLIO|2024-10-01" in removed.stderr
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        assert connection.execute(cfo_open).fetchone()[0] > 0
        assert connection.execute("SELECT count(*) FROM transcripts WHERE company = 'HLIO'").fetchone()[0] == 2
    status = json.loads(run_tkg(home, "status", "--json").stdout)
    missing = {(p["company"], p["quarter"]) for p in status["partitions"] if p["state"] == "missing"}
    assert missing == {("HLIO", "2024-07-01"), ("HLIO", "2024-10-01")} and status["graph"] != "up to date"


def _duckdb_cli() -> str | None:
    """The CLI on PATH, or the one installed beside this Python (a venv that is not activated)."""
    beside = Path(sys.executable).parent / "duckdb"
    return shutil.which("duckdb") or (str(beside) if beside.exists() else None)


@pytest.mark.skipif(_duckdb_cli() is None, reason="the DuckDB CLI (PyPI package duckdb-cli, in the test extras) is not installed")
def test_the_stock_duckdb_cli_opens_the_file_and_every_view_and_macro(sample_home):
    version = subprocess.run([_duckdb_cli(), "--version"], capture_output=True, text=True).stdout
    queries = []
    for model in load_models():
        call = model.name
        if model.is_macro:  # every macro of the SQL surface takes timestamps: (ts) or (ts, known_at)
            parameters = re.search(rf"MACRO\s+{model.name}\s*\(([^)]*)\)", model.sql, re.IGNORECASE)[1].split(",")
            call += "(" + ", ".join("TIMESTAMP '2024-09-01'" for _ in parameters) + ")"
        queries.append(f"SELECT count(*) FROM {call};")
    completed = subprocess.run([_duckdb_cli(), "-readonly", str(sample_home / "tkg.duckdb"), "-csv", "-c", "".join(queries)],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, (version, completed.stderr)
    counts = [line for line in completed.stdout.splitlines() if line.strip().isdigit()]
    assert len(counts) == len(queries) and int(counts[0]) >= 0, (version, completed.stdout)
