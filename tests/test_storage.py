"""Past one machine: the Parquet system of record in an S3-compatible store (TKG_STORAGE), the
published file shared through it (TKG_DUCKDB_UPLOAD), and LLM responses cached in PostgreSQL
(TKG_CACHE) so that workers on separate machines pay for an answer once.

The servers are real and local (tests/services.py): moto's S3 server and PostgreSQL on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

from fakes.openai_server import OpenAICompatibleServer
from fakes.responders import PipelineResponder
from tests.conftest import run_tkg
from tests.test_safety import facts_digest
from tkg.core import tables
from tkg.llm.cache import PostgresResponseCache, ResponseCache, cache_key, open_cache
from tkg.store.parquet import ParquetStore, download

pytestmark = pytest.mark.services


@pytest.fixture
def bucket_env(s3_server, monkeypatch):
    """A new bucket, and this process's AWS variables pointing at the local server only."""
    bucket = s3_server.create_bucket("tkg")
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return bucket, s3_server.environment()


def _rows(table, columns: list[str]) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)), key=repr)


def test_a_build_on_the_object_store_equals_a_local_build_keeps_nothing_on_disk_and_removes_a_partition(
        bucket_env, s3_server, sample_home, tmp_path):
    """One build on the object store serves every step (a build of the sample there is the
    slow part): equal to the local build, planned from the store's stamps, rebuilt on --force,
    and a partition removed from it is gone."""
    bucket, aws = bucket_env
    storage = f"s3://{bucket}/graph"
    env = {**aws, "TKG_STORAGE": storage, "TKG_DUCKDB_UPLOAD": f"s3://{bucket}/published/tkg.duckdb"}
    home = tmp_path / "home"

    run_tkg(home, "build", env=env, check=True)
    keys = s3_server.keys(bucket)
    for stage in ("transcripts", "chunks", "statements", "temporal_events", "triplets", "figures", "entities"):
        assert f"graph/{stage}/company=QNTX/quarter=2024-07-01/{stage}.parquet" in keys, (stage, keys[:20])
    assert {"graph/canonical_entities/canonical_entities.parquet", "graph/invalidated_events/event_invalidations.parquet",
            "published/tkg.duckdb"} <= set(keys)
    assert not list(home.rglob("*.parquet")) and not (home / "parquet").exists()
    assert facts_digest(home) == facts_digest(sample_home)

    # Reading back: the store gives the same rows as the local build's store.
    remote, local = ParquetStore(home, storage), ParquetStore(sample_home)
    assert remote.display(remote.partition_path("statements", "QNTX", "2024-07-01")).startswith(f"s3://{bucket}/graph/")
    columns = ["statement_hash", "company", "statement"]
    assert (_rows(remote.read_all("statements", tables.STATEMENTS, columns), columns)
            == _rows(local.read_all("statements", tables.STATEMENTS, columns), columns))
    assert remote.stamp(remote.global_path("canonical_entities")) == local.stamp(local.global_path("canonical_entities"))

    # The shared copy is the published file.
    assert download(f"s3://{bucket}/published/tkg.duckdb", tmp_path / "fetched" / "tkg.duckdb")
    assert facts_digest(tmp_path / "fetched") == facts_digest(home)

    # A second build plans from the stamps in the store: nothing to do.
    again = run_tkg(home, "build", env=env, check=True)
    assert "up to date" in again.stderr, again.stderr

    # A forced rebuild rewrites the objects and comes out the same.
    before = {key: s3_server.client().head_object(Bucket=bucket, Key=key)["LastModified"] for key in keys}
    run_tkg(home, "build", "--force", env=env, check=True)
    statements_key = "graph/statements/company=QNTX/quarter=2024-07-01/statements.parquet"
    assert s3_server.client().head_object(Bucket=bucket, Key=statements_key)["LastModified"] >= before[statements_key]
    assert facts_digest(home) == facts_digest(sample_home)

    # A partition removed from the object store is gone, from the store and the graph.
    assert remote.is_file(remote.partition_path("statements", "QNTX", "2024-07-01"))
    run_tkg(home, "remove", "QNTX", "2024Q3", env=env, check=True)
    assert not remote.is_file(remote.partition_path("statements", "QNTX", "2024-07-01"))
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        quarters = {str(q) for (q,) in connection.execute("SELECT DISTINCT quarter FROM transcripts WHERE company = 'QNTX'").fetchall()}
    assert "2024-07-01" not in quarters


def test_a_bad_storage_uri_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        ParquetStore(tmp_path, "gs://bucket/prefix")
    with pytest.raises(ValueError, match="unsupported storage URI 's3:/bucket'"):  # a typo, not a folder named 's3:'
        ParquetStore(tmp_path, "s3:/bucket")
    with pytest.raises(ValueError, match="names no bucket"):
        ParquetStore(tmp_path, "s3://")
    failed = run_tkg(tmp_path / "home", "build", env={"TKG_STORAGE": "ftp://somewhere/x"})
    assert failed.returncode != 0 and "unsupported storage URI" in failed.stderr + failed.stdout


@pytest.fixture
def cache_url(postgres_server) -> str:
    return postgres_server.url(postgres_server.create_database("tkg_cache"))


def test_the_postgres_cache_has_the_sqlite_cache_semantics(cache_url, tmp_path):
    key = cache_key("statements", "gpt-4.1-mini", "template", "settings", "We grew revenue 10%.")
    for cache in (ResponseCache(tmp_path / "cache.sqlite"), PostgresResponseCache(cache_url)):
        assert cache.get(key) is None and len(cache) == 0
        cache.put(key, "statements", "gpt-4.1-mini", {"statements": [{"text": "a"}]})
        assert cache.get(key) == {"statements": [{"text": "a"}]} and len(cache) == 1
        cache.put(key, "statements", "gpt-4.1-mini", {"statements": []})  # a re-ask replaces the answer
        assert cache.get(key) == {"statements": []} and len(cache) == 1
    assert isinstance(open_cache(tmp_path, cache_url), PostgresResponseCache)
    assert PostgresResponseCache(cache_url).get(key) == {"statements": []}  # another client sees it
    with pytest.raises(ValueError, match="postgresql://"):
        open_cache(tmp_path, "redis://127.0.0.1/0")


def test_two_workers_sharing_the_postgres_cache_pay_once(cache_url, tmp_path):
    """Two builds on separate data folders (separate machines, as far as tkg can tell) through
    one LLM server: the second one makes no request at all. Each builds two of the sample's
    calls (one company's last two quarters): what is cached does not depend on how many."""
    with OpenAICompatibleServer(PipelineResponder(), latency_s=0.0, max_in_flight=64) as server:
        results = []
        for worker in ("a", "b"):
            home = tmp_path / worker
            env = {**os.environ, "TKG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"),
                   "OPENAI_BASE_URL": server.base_url, "TKG_CACHE": cache_url}
            for name in ("OPENAI_API_KEY", "TKG_LLM", "TKG_EMBEDDINGS"):
                env.pop(name, None)
            server.reset_stats()
            completed = subprocess.run([sys.executable, "-m", "tkg.cli", "build", "--company", "HLIO", "--since", "2024-07-01"],
                                       env=env, capture_output=True, text=True, timeout=600)
            assert completed.returncode == 0, completed.stderr[-3000:]
            assert cache_url.split("@")[0] not in completed.stdout + completed.stderr  # the credentials never printed
            results.append((server.stats().total_requests, facts_digest(home)))
            assert not (home / "cache" / "llm_responses.sqlite").exists()
    (first_requests, first_facts), (second_requests, second_facts) = results
    assert first_requests > 0 and second_requests == 0
    assert first_facts == second_facts
