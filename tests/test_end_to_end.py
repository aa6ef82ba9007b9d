"""`tkg build` on real transcripts (INTC and AMD, 2016-2017) through Dagster, then SQL on the
published tkg.duckdb: gold cases dev-r1 and dev-r2."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import CORPUS, gold_cases, needs_corpus

pytestmark = [needs_corpus, pytest.mark.slow]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    home = tmp_path_factory.mktemp("tkg_home")
    env = {**os.environ, "TKG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home")}
    env.pop("OPENAI_API_KEY", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tkg.cli", "build", "--source", str(CORPUS), "--company", "INTC", "--company", "AMD",
         "--since", "2016-01-01", "--until", "2017-12-31"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return home


def _holders(path, company: str, role: str, as_of: str) -> set[str]:
    with duckdb.connect(str(path), read_only=True) as connection:
        rows = connection.execute(
            "SELECT DISTINCT subject FROM facts_as_of(CAST(? AS TIMESTAMP)) "
            "WHERE company = ? AND predicate = 'HOLDS_ROLE' AND object LIKE ? || ' of %'",
            [as_of, company, role],
        ).fetchall()
    return {name for (name,) in rows}


def test_build_publishes_every_partition(built):
    with duckdb.connect(str(built / "tkg.duckdb"), read_only=True) as connection:
        calls = connection.execute("SELECT company, count(*) FROM transcripts GROUP BY ALL ORDER BY 1").fetchall()
        assert calls == [("AMD", 8), ("INTC", 8)]
        assert connection.execute("SELECT count(*) FROM facts WHERE predicate = 'HOLDS_ROLE'").fetchone()[0] > 200
    # the runs are recorded in the persistent DAGSTER_HOME, so `dagster dev` shows them later
    assert any((built / "dagster_home").rglob("*.db"))


@pytest.mark.parametrize("case", [c for c in gold_cases("role_as_of") if c["id"] in {"dev-r1", "dev-r2"}], ids=lambda c: c["id"])
def test_gold_cfo_as_of(built, case):
    holders = _holders(built / "tkg.duckdb", case["company"], case["role"], case["as_of"])
    assert holders & set(case["aliases"]), holders
    assert not holders & set(case["others"]), holders


def test_stacy_smith_is_retired_by_swan(built):
    with duckdb.connect(str(built / "tkg.duckdb"), read_only=True) as connection:
        rows = connection.execute(
            "SELECT DISTINCT f.invalid_at::DATE::VARCHAR, i.subject FROM facts f "
            "JOIN facts i ON i.event_id = f.invalidated_by "
            "WHERE f.subject = 'Stacy Smith' AND f.object = 'CFO of Intel Corporation'"
        ).fetchall()
    assert rows == [("2016-10-18", "Robert H. Swan")]


def test_cli_sql_reads_the_warehouse(built):
    env = {**os.environ, "TKG_HOME": str(built), "DAGSTER_HOME": str(built / "dagster_home")}
    completed = subprocess.run(
        [sys.executable, "-m", "tkg.cli", "sql",
         "SELECT subject FROM facts_as_of(TIMESTAMP '2017-06-01') WHERE company = 'INTC' AND object = 'CFO of Intel Corporation'"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "Robert H. Swan" in completed.stdout and "Stacy Smith" not in completed.stdout
