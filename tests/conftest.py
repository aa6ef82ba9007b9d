"""Shared fixtures. Tests that need the real corpus skip with a clear reason when ../shared is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TKG_SHARED", ROOT.parent / "shared"))
CORPUS = SHARED / "data" / "earnings_calls" / "transcripts.parquet"
GOLD_DEV = SHARED / "eval" / "gold_dev.jsonl"

needs_corpus = pytest.mark.skipif(
    not CORPUS.exists(), reason=f"the real corpus is not at {CORPUS} (set TKG_SHARED to the folder holding data/earnings_calls)"
)
needs_gold = pytest.mark.skipif(not GOLD_DEV.exists(), reason=f"the gold questions are not at {GOLD_DEV}")


def gold_cases(kind: str) -> list[dict]:
    if not GOLD_DEV.exists():
        return []
    return [case for case in map(json.loads, GOLD_DEV.read_text().splitlines()) if case["kind"] == kind]


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path, monkeypatch):
    """No test reads the developer's TKG_*/OPENAI settings or writes into the repository."""
    for name in ("TKG_HOME", "TKG_SOURCE", "TKG_DUCKDB", "TKG_LLM", "TKG_EMBEDDINGS", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir(exist_ok=True)


@pytest.fixture(scope="session")
def corpus_rows():
    if not CORPUS.exists():
        pytest.skip(f"the real corpus is not at {CORPUS}")
    from tkg.sources import load_source

    return load_source(str(CORPUS)).rows
