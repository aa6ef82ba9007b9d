"""Shared fixtures. Tests that need the real corpus skip with a clear reason when ../shared is absent."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# PostgreSQL, Redis and S3 servers for the tests marked `services` (tests/services.py).
from tests.services import postgres_server, redis_server, s3_server  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TKG_SHARED", ROOT.parent / "shared"))
CORPUS = SHARED / "data" / "earnings_calls" / "transcripts.parquet"
GOLD_DEV = SHARED / "eval" / "gold_dev.jsonl"

needs_corpus = pytest.mark.skipif(
    not CORPUS.exists(), reason=f"the real corpus is not at {CORPUS} (set TKG_SHARED to the folder holding data/earnings_calls)"
)
needs_gold = pytest.mark.skipif(not GOLD_DEV.exists(), reason=f"the gold questions are not at {GOLD_DEV}")


def pytest_report_header(config):
    """The free space where the tests write, so that a run that fills the disk says so at its top."""
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free / 2**30
    return f"free disk in {folder}: {free:.1f} GiB (the suite needs about 1 GiB there at its peak)"


def offline_runtime(home: Path):
    """What the offline path builds with, into data folder `home` (rules, wordllama)."""
    from tkg.build.stages import Runtime
    from tkg.settings import Settings

    return Runtime.open(Settings.resolve(home=home, backend="offline", embeddings="wordllama"))


def gold_cases(kind: str) -> list[dict]:
    if not GOLD_DEV.exists():
        return []
    return [case for case in map(json.loads, GOLD_DEV.read_text().splitlines()) if case["kind"] == kind]


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path, monkeypatch):
    """No test reads the developer's TKG_*/OPENAI settings or writes into the repository."""
    for name in ("TKG_HOME", "TKG_SOURCE", "TKG_DUCKDB", "TKG_LLM", "TKG_EMBEDDINGS", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                 "TKG_STORAGE", "TKG_CACHE", "TKG_DUCKDB_UPLOAD"):
        monkeypatch.delenv(name, raising=False)
    for name in [name for name in os.environ if name.startswith("AWS_")]:  # no test talks to a real cloud
        monkeypatch.delenv(name)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir(exist_ok=True)


def run_tkg(home: Path, *args: str, env: dict | None = None, timeout: float = 900, check: bool = False):
    """`tkg ...` in a subprocess, as a user runs it: offline unless `env` says otherwise, with
    the data folder `home` and no DAGSTER_HOME of the developer's."""
    import subprocess
    import sys

    environment = {**os.environ, "TKG_HOME": str(home), **(env or {})}
    for name in ("OPENAI_API_KEY", "TKG_LLM", "DAGSTER_HOME"):
        if name not in (env or {}):
            environment.pop(name, None)
    completed = subprocess.run([sys.executable, "-m", "tkg.cli", *args], env=environment, capture_output=True, text=True,
                               timeout=timeout)
    if check:
        assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


@pytest.fixture(scope="session")
def corpus_home(tmp_path_factory, worker_id):
    """The whole real corpus built once per run with `tkg build`, offline (about 70 s). Every
    test worker (pytest-xdist runs each as a session of its own) shares the one folder: the
    first to ask builds it while the others wait. Tests only read it, or copy from it."""
    if not CORPUS.exists():
        pytest.skip(f"the real corpus is not at {CORPUS}")
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    home, built = shared / "corpus", shared / "corpus.built"
    with FileLock(str(shared / "corpus.lock")):
        if not built.exists():
            shutil.rmtree(home, ignore_errors=True)  # what a worker whose build failed left
            run_tkg(home, "build", "--source", str(CORPUS), timeout=1800, check=True)
            built.touch()
    return home


@pytest.fixture(scope="session")
def sample_home(tmp_path_factory):
    """The bundled sample built once per session with `tkg build`; copy it before changing it."""
    home = tmp_path_factory.mktemp("sample")
    run_tkg(home, "build", check=True)
    return home


@pytest.fixture(scope="session")
def corpus_rows():
    if not CORPUS.exists():
        pytest.skip(f"the real corpus is not at {CORPUS}")
    from tkg.ingest.sources import load_source

    return load_source(str(CORPUS)).rows
