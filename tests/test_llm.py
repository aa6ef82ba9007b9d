"""The LLM path over real HTTP: the real openai SDK against a local OpenAI-compatible server.

The server answers with scripted structured outputs (what the offline rules produce) and
injects faults on demand; everything between tkg and the socket is the code under test.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import date

import dagster as dg
import duckdb
import numpy as np
import pytest

from fakes.openai_server import OpenAICompatibleServer
from fakes.responders import PipelineResponder
from tkg.core.companies import get_company
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.core.models import RawStatement
from tkg.core.paths import prompts_dir
from tkg.extract.base import DocumentContext
from tkg.extract.offline import OfflineExtractor
from tkg.ingest.chunking import chunk_transcript
from tkg.ingest.parsing import parse_transcript
from tkg.ingest.sources import load_source
from tkg.invalidate.judges import EventView, JudgeCase, TripletView
from tkg.llm.cache import ResponseCache
from tkg.llm.client import LLMClient
from tkg.llm.extractor import LLMExtractor, LLMJudge, OpenAIEmbedder, stage_fingerprint
from tkg.llm.settings import LLMSettings

API_KEY = "sk-test-0123456789-do-not-leak"


@pytest.fixture(scope="module")
def server():
    with OpenAICompatibleServer(PipelineResponder(), latency_s=0.0, max_in_flight=64, retry_after_s=0.3,
                                fault_timeout_s=3.0) as running:
        yield running


@pytest.fixture
def fresh(server):
    server.reset_stats()
    server.clear_faults()
    server.configure(p_429=0.0, p_500=0.0, latency_s=0.0)
    server.set_responder(PipelineResponder())
    return server


def settings_for(server, **changes) -> LLMSettings:
    return replace(LLMSettings(base_url=server.base_url, batch_size=4, max_in_flight=8, max_attempts=4, timeout_s=5.0), **changes)


@pytest.fixture
def make(fresh, tmp_path):
    clients = []

    def build(**changes):
        client = LLMClient(settings_for(fresh, **changes), API_KEY)
        clients.append(client)
        cache = ResponseCache(tmp_path / f"cache{len(clients)}.sqlite")
        return LLMExtractor(client, cache), LLMJudge(client, cache), OpenAIEmbedder(client, cache)

    yield build
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def sample_call():
    row = next(r for r in load_source("sample").rows if r.company == "HLIO" and r.call_date == date(2024, 8, 6))
    transcript = parse_transcript(row, get_company("HLIO"))
    context = DocumentContext.for_transcript(transcript, get_company("HLIO"))
    chunks = chunk_transcript(transcript, WordLlamaEmbedder())
    # chunks that yield statements first, so chunks[1:2] etc. always ask for something real
    said = OfflineExtractor().extract_statements(chunks, context)
    return context, [c for c, s in zip(chunks, said) if s] + [c for c, s in zip(chunks, said) if not s]


def test_each_stage_returns_what_the_model_said(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, judge, embedder = make()
    offline = OfflineExtractor()

    statements = extractor.extract_statements(chunks, context)
    assert statements == offline.extract_statements(chunks, context)
    flat = [s for per_chunk in statements for s in per_chunk]
    assert len(flat) > 15
    assert fresh.stats().requests["responses"] == len(chunks)  # one request per chunk

    dated = [s for s in flat if s.temporal_type != "ATEMPORAL"]
    assert extractor.extract_validity(dated, context) == offline.extract_validity(dated, context)
    assert extractor.extract_triplets(flat, context) == offline.extract_triplets(flat, context)
    # batches of 4 statements per request
    requests = fresh.stats().requests["responses"]
    assert requests == len(chunks) + -(-len(dated) // 4) + -(-len(flat) // 4)

    vectors = embedder.embed([s.statement for s in flat])
    assert vectors.shape == (len(flat), 256) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert fresh.stats().requests["embeddings"] == 1  # all statements in one request

    old = EventView("a", "Dana Whitfield is CFO of Helio Robotics, Inc.", "FACT", "DYNAMIC", context.publication_date, None,
                    context.publication_date, (TripletView("Dana Whitfield", "p1", "HOLDS_ROLE", "CFO of Helio Robotics, Inc.", "o", "CFO"),))
    later = lambda person, office, event_id: EventView(event_id, f"{person} is {office}.", "FACT", "DYNAMIC",
                                                       context.publication_date.replace(year=2025), None, context.publication_date,
                                                       (TripletView(person, person, "HOLDS_ROLE", office, office, "CFO"),))
    case = JudgeCase(old, (later("Marcus J. Ortega", "CFO of Helio Robotics, Inc.", "b"), later("Dana Whitfield", "EVP of Helio Robotics, Inc.", "c")))
    verdicts = judge.judge([case])[0]
    assert [v.invalidates for v in verdicts] == [True, False] and all(v.reason for v in verdicts)
    assert fresh.stats().requests["responses"] == requests + 1  # one request for the event and all its candidates


def test_chat_completions_fallback(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, _, _ = make(api_mode="chat")
    assert extractor.extract_statements(chunks[:3], context) == OfflineExtractor().extract_statements(chunks[:3], context)
    assert fresh.stats().requests.get("chat.completions") == 3 and not fresh.stats().requests.get("responses")


def test_429_honours_retry_after(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, _, _ = make()
    fresh.queue_faults("429")
    started = time.perf_counter()
    assert extractor.extract_statements(chunks[1:2], context)[0]
    stats = extractor.stats("statements")
    assert (stats.rate_limited, stats.retries, stats.requests) == (1, 1, 2)
    assert time.perf_counter() - started >= 0.3  # the server's Retry-After


def test_500s_and_timeouts_are_retried(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, _, _ = make(timeout_s=1.0)
    fresh.queue_faults("500", "timeout", "500")
    assert extractor.extract_statements(chunks[1:2], context)[0]
    stats = extractor.stats("statements")
    assert stats.retries == 3 and stats.requests == 4 and stats.dropped_total == 0


def test_bad_output_is_reasked_once_then_dropped_and_counted(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, _, _ = make()
    fresh.queue_faults("garbage")
    assert extractor.extract_statements(chunks[1:2], context)[0]
    assert extractor.stats("statements").reasks == 1
    fresh.queue_faults("schema_violation", "garbage")
    assert extractor.extract_statements(chunks[2:3], context) == [[]]
    stats = extractor.stats("statements")
    assert stats.reasks == 2 and stats.dropped["chunk_without_usable_answer"] == 1


def test_near_misses_are_repaired_or_dropped_and_counted(make, fresh, sample_call):
    context, _ = sample_call
    extractor, _, _ = make(batch_size=3)

    def responder(request):
        if request.schema_name == "ValidityOut":  # an end before the start, an unparseable date, one left out
            if request.input_text.rsplit("Statements:", 1)[-1].count("- [") < 3:
                return {"items": []}  # the statement left out is asked once more, alone; still nothing
            return {"items": [{"index": 0, "valid_at": "2024-08-06T00:00:00Z", "invalid_at": "2020-01-01T00:00:00Z"},
                              {"index": 1, "valid_at": "sometime soon", "invalid_at": None}]}  # index 2 missing
        return {"items": [{"index": 0, "entities": [{"entity_idx": 0, "name": "Helio", "type": "company", "description": ""},
                                                     {"entity_idx": 1, "name": "Atlas Lift", "type": "Product", "description": ""}],
                           "triplets": [{"subject_name": "Helio", "subject_id": 0, "predicate": "launch ed", "object_name": "Atlas Lift",
                                         "object_id": 1, "value": None},
                                        {"subject_name": "Helio", "subject_id": 0, "predicate": "MERGED_WITH", "object_name": "x",
                                         "object_id": 1, "value": None},
                                        {"subject_name": "Helio", "subject_id": 0, "predicate": "SELLS", "object_name": "y",
                                         "object_id": 7, "value": None}]}]}

    fresh.set_responder(responder)
    statements = [RawStatement(statement=f"Helio launched product {n}.", statement_type="FACT", temporal_type="DYNAMIC")
                  for n in range(3)]
    ranges = extractor.extract_validity(statements, context)
    assert ranges[0].invalid_at is None and ranges[1].valid_at is None and ranges[2] is None
    validity = extractor.stats("validity")
    assert validity.repaired == {"invalid_at_before_valid_at_dropped": 1, "valid_at_unparseable_set_null": 1}
    assert validity.dropped["validity_statement_without_answer"] == 1 and validity.requests == 2
    extraction = extractor.extract_triplets(statements[:1], context)[0]
    assert [t.predicate.value for t in extraction.triplets] == ["LAUNCHED", "SELLS"]
    triplets = extractor.stats("triplets")
    assert triplets.repaired["predicate_mapped_to_vocabulary"] == 1 and triplets.dropped["triplet_unknown_predicate"] == 1
    from tkg.extract.base import drop_dangling_triplets

    assert len(drop_dangling_triplets(extraction, triplets).triplets) == 1  # entity 7 does not exist
    assert triplets.dropped["triplet_entity_index_out_of_range"] == 1


def test_cache_is_shared_across_processes(fresh, tmp_path):
    """Two processes extract the same chunks: the second makes no request."""
    script = f"""
import sys
from dataclasses import replace
from datetime import date
from tkg.ingest.chunking import chunk_transcript
from tkg.core.companies import get_company
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.extract.base import DocumentContext
from tkg.llm.cache import ResponseCache
from tkg.llm.client import LLMClient
from tkg.llm.extractor import LLMExtractor
from tkg.llm.settings import LLMSettings
from tkg.core.models import RawStatement
from tkg.ingest.parsing import parse_transcript
from tkg.core.paths import prompts_dir
from tkg.ingest.sources import load_source
row = next(r for r in load_source("sample").rows if r.company == "QNTX")
transcript = parse_transcript(row, get_company("QNTX"))
chunks = chunk_transcript(transcript, WordLlamaEmbedder())
extractor = LLMExtractor(LLMClient(LLMSettings(base_url={fresh.base_url!r}), "k"), ResponseCache({str(tmp_path / "shared.sqlite")!r}))
statements = extractor.extract_statements(chunks, DocumentContext.for_transcript(transcript, get_company("QNTX")))
stats = extractor.stats("statements")
print(stats.requests, stats.cache_hits, sum(map(len, statements)))
"""
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    requests_1, hits_1, found_1 = map(int, first.stdout.split())
    requests_2, hits_2, found_2 = map(int, second.stdout.split())
    assert requests_1 > 0 and hits_1 == 0
    assert requests_2 == 0 and hits_2 == requests_1 and found_2 == found_1


def test_token_and_cost_accounting_match_the_provider(make, fresh, sample_call):
    context, chunks = sample_call
    extractor, _, embedder = make()
    extractor.extract_statements(chunks, context)
    stats, served = extractor.stats("statements"), fresh.stats()
    assert stats.input_tokens == served.input_tokens > 0
    assert stats.output_tokens == served.output_tokens > 0
    assert stats.cached_input_tokens == served.cached_tokens
    price = LLMSettings().prices["gpt-4.1-mini"]
    expected = ((stats.input_tokens - stats.cached_input_tokens) * price[0] + stats.cached_input_tokens * price[1]
                + stats.output_tokens * price[2]) / 1e6
    assert stats.cost_usd == pytest.approx(expected)
    assert LLMSettings(service_tier="flex").cost_usd("gpt-4.1-mini", 1000, 0, 1000) == pytest.approx(
        (1000 * price[0] + 1000 * price[2]) / 1e6 / 2)
    summary = stats.summary()
    assert summary["latency_p50_ms"] is not None and summary["requests"] == len(chunks)


@pytest.fixture
def prompts(tmp_path, monkeypatch):
    """The prompt templates read from a copy a test may edit; `edited(name, old, new)` changes
    one and makes the process read it afresh, as the next `tkg build` or `dagster dev` would."""
    import tkg.llm.prompts

    copy = tmp_path / "prompts"
    shutil.copytree(prompts_dir(), copy)

    def read_afresh() -> None:
        tkg.llm.prompts._environment.cache_clear()
        tkg.llm.prompts.template_sha256.cache_clear()

    def edited(name: str, old: str, new: str) -> None:
        template = copy / name
        assert old in template.read_text(), f"{old!r} is no longer in prompts/{name}"
        template.write_text(template.read_text().replace(old, new))
        read_afresh()

    with monkeypatch.context() as patch:
        patch.setattr(tkg.llm.prompts, "prompts_dir", lambda: copy)
        read_afresh()
        yield edited
    read_afresh()


ANALYST = "You are a financial analyst who turns earnings-call excerpts into atomic statements"
AUDITOR = "You are a careful auditor who turns earnings-call excerpts into atomic statements"


def test_code_version_follows_prompt_and_model(prompts):
    """Editing prompts/statement_extraction.j2 gives the statements stage a new code version and
    leaves the other stages theirs; a new model does too, a new batch size does not."""
    base = LLMSettings()
    before = {stage: stage_fingerprint(base, stage) for stage in ("statements", "validity", "triplets", "judge")}
    prompts("statement_extraction.j2", ANALYST, AUDITOR)
    after = {stage: stage_fingerprint(base, stage) for stage in before}
    assert after["statements"] != before["statements"]
    assert {stage: version for stage, version in after.items() if stage != "statements"} == {
        stage: version for stage, version in before.items() if stage != "statements"}
    assert stage_fingerprint(base, "statements") != stage_fingerprint(replace(base, models={**base.models, "statements": "gpt-4.1"}), "statements")
    assert stage_fingerprint(base, "validity") == stage_fingerprint(replace(base, batch_size=1), "validity")


def test_requests_carry_the_prompt_template_as_edited(make, fresh, sample_call, prompts):
    """What reaches the provider is the template's text: edit the instructions, then the input
    block, of a copy, and each next request carries exactly that edit and nothing else changes.
    An answer cached under the old prompt is not reused, even when only the instructions changed."""
    context, chunks = sample_call
    sent = []
    responder = PipelineResponder()

    def recording(request):
        sent.append(request.body)
        return responder(request)

    def request_after(edit: tuple[str, str]) -> dict:
        prompts("statement_extraction.j2", *edit)
        sent.clear()
        assert extractor.extract_statements(chunks[:1], context) == statements
        (body,) = sent
        return body

    def without_prompt(body: dict) -> dict:
        return {key: value for key, value in body.items() if key not in ("instructions", "input")}

    fresh.set_responder(recording)
    extractor, _, _ = make()
    statements = extractor.extract_statements(chunks[:1], context)
    (original,) = sent
    assert original["instructions"].startswith(ANALYST)
    assert original["input"].startswith("Document context:\n- main entity: Helio Robotics")

    instructions_edited = request_after((ANALYST, AUDITOR))
    assert instructions_edited["instructions"] == original["instructions"].replace(ANALYST, AUDITOR)
    assert instructions_edited["input"] == original["input"]
    input_edited = request_after(("Document context:", "About the call:"))
    assert input_edited["instructions"] == instructions_edited["instructions"]
    assert input_edited["input"] == original["input"].replace("Document context:", "About the call:")
    assert without_prompt(input_edited) == without_prompt(instructions_edited) == without_prompt(original)


def test_backend_follows_the_key_or_a_configured_server(monkeypatch):
    from resources.tkg import ExtractionBackend, TkgStorage, settings_of
    from tkg.settings import Settings

    def backend(**fields) -> str:  # as a Dagster step resolves it from its resources
        return settings_of(TkgStorage(), extraction=ExtractionBackend(**fields)).backend

    assert backend() == "offline" and Settings.resolve().backend == "offline"
    assert backend(base_url="http://127.0.0.1:8000/v1") == "openai"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    assert backend() == "openai"
    assert "openai-compatible at http://127.0.0.1:8000/v1" in Settings.resolve().describe()
    monkeypatch.setenv("TKG_LLM", "offline")  # an explicit choice wins
    assert backend() == "offline"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("TKG_LLM")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    assert backend() == "openai"


def _materialise_in_order(assets, resources, instance) -> None:
    """The global assets one after another in lineage order, as the automation chain runs them:
    a shard step's shards in one run each (a shard partition cannot share a run with an
    unpartitioned asset)."""
    for asset in assets:
        keys = asset.partitions_def.get_partition_keys() if asset.partitions_def else [None]
        for key in keys:
            assert dg.materialize([asset], partition_key=key, resources=resources, instance=instance).success


def test_a_partition_through_dagster_and_a_warm_rerun(fresh, tmp_path, monkeypatch, caplog):
    from resources.tkg import (
        ExtractionBackend,
        TkgStorage,
        TranscriptSource,
        settings_of,
    )
    from tkg_assets.definitions import pipeline_assets
    from tkg_assets.partitions import partition_key

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    home = tmp_path / "home"
    resources = {
        "storage": TkgStorage(home=str(home)),
        "source": TranscriptSource(source="sample"),
        "extraction": ExtractionBackend(backend="openai", embeddings="openai", api_key=dg.EnvVar("OPENAI_API_KEY"),
                                        base_url=fresh.base_url),
    }
    partitioned, global_assets = pipeline_assets(settings_of(resources["storage"], resources["source"], resources["extraction"]))
    PARTITIONED_ASSETS, GLOBAL_ASSETS = partitioned, global_assets[:-1]  # without the SQL models
    key = partition_key("QNTX", date(2024, 10, 1))
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance")) as instance:
        assert dg.materialize(PARTITIONED_ASSETS, partition_key=key, resources=resources, instance=instance).success
        _materialise_in_order(GLOBAL_ASSETS, resources, instance)
        cold = fresh.stats().total_requests
        assert cold > 0 and fresh.stats().requests["embeddings"] >= 1
        fresh.reset_stats()
        assert dg.materialize(PARTITIONED_ASSETS, partition_key=key, resources=resources, instance=instance).success
        _materialise_in_order(GLOBAL_ASSETS, resources, instance)
        assert fresh.stats().total_requests == 0  # a warm cache pays for nothing
        records = [str(record) for record in instance.all_logs(instance.get_runs()[0].run_id)]
        metadata = [str(m.metadata) for run in instance.get_runs() for m in
                    [e.asset_materialization for e in instance.all_logs(run.run_id) if e.asset_materialization]]

    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        stages = dict(connection.execute("SELECT stage, sum(requests) FROM llm_calls GROUP BY ALL").fetchall())
        assert {"statements", "validity", "triplets", "embeddings"} <= set(stages) and stages["statements"] == 0  # the warm rerun wrote 0
        assert connection.execute("SELECT count(*) FROM facts WHERE predicate = 'HOLDS_ROLE'").fetchone()[0] > 5
        dumped = connection.execute("SELECT * FROM llm_calls").fetchall() + connection.execute("SELECT * FROM facts").fetchall()

    # The key appears nowhere: logs, Dagster events, metadata, the warehouse, the cache, the Parquet files.
    haystacks = [caplog.text, *records, *metadata, repr(dumped)]
    haystacks += [p.read_bytes().decode("latin-1") for p in home.rglob("*") if p.is_file()]
    assert not any(API_KEY in text for text in haystacks)


def test_tkg_build_through_a_configured_server_then_warm(fresh, tmp_path):
    """`tkg build --workers 2` on the sample with only OPENAI_BASE_URL set: every stage goes
    over HTTP; the same build again makes 0 requests."""
    home = tmp_path / "home"
    env = {**os.environ, "TKG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"), "OPENAI_BASE_URL": fresh.base_url}
    for name in ("OPENAI_API_KEY", "TKG_LLM", "TKG_EMBEDDINGS"):
        env.pop(name, None)
    command = [sys.executable, "-m", "tkg.cli", "build", "--workers", "2"]

    cold = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "openai-compatible at " + fresh.base_url in cold.stderr
    requests = fresh.stats().requests
    assert requests["responses"] > 0 and requests["embeddings"] > 0, requests
    with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
        stages = dict(connection.execute("SELECT stage, sum(requests) FROM llm_calls GROUP BY ALL").fetchall())
        assert {"statements", "validity", "triplets", "embeddings"} <= set(stages)
        assert sum(stages.values()) == fresh.stats().total_requests  # each request counted once
        assert connection.execute("SELECT count(DISTINCT company) FROM facts").fetchone()[0] == 2

    fresh.reset_stats()
    warm = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert fresh.stats().total_requests == 0


def test_random_429s_and_500s_lose_nothing(make, fresh, sample_call):
    """A provider that fails a quarter of all requests at random: every statement still comes back."""
    context, chunks = sample_call
    extractor, _, _ = make(max_attempts=10)
    expected = OfflineExtractor().extract_statements(chunks, context)
    fresh.configure(p_429=0.2, p_500=0.05, retry_after_s=0.05, seed=3)
    try:
        assert extractor.extract_statements(chunks, context) == expected
    finally:
        fresh.configure(p_429=0.0, p_500=0.0, retry_after_s=0.3)
    stats = extractor.stats("statements")
    assert stats.rate_limited > 0 and stats.retries > 0 and stats.dropped_total == 0


def test_usage_rows_count_each_request_once(make, fresh, sample_call):
    """One extractor serving several steps: each step's usage is what its counters measured
    while it ran (as the stage runner measures it), and together they are what the provider saw."""
    context, chunks = sample_call
    extractor, _, _ = make()

    def measured(counters, work) -> dict[str, dict]:
        before = {counter: extractor.stats(counter).snapshot() for counter in counters}
        work()
        rows = {counter: extractor.usage_row(counter, extractor.stats(counter).since(earlier))
                for counter, earlier in before.items()}
        return {counter: row for counter, row in rows.items() if row is not None}

    first = measured(("statements",), lambda: extractor.extract_statements(chunks[:4], context))
    flat = [s for per_chunk in extractor.extract_statements(chunks[:4], context) for s in per_chunk]  # cached now
    second = measured(("statements", "triplets"), lambda: extractor.extract_triplets(flat, context))
    assert sum(row["requests"] for row in [*first.values(), *second.values()]) == fresh.stats().requests["responses"]
    assert first["statements"]["requests"] > 0 and second["statements"]["requests"] == 0
    assert second["triplets"]["requests"] > 0 and second["triplets"]["stage"] == "triplets"


def test_a_partial_batched_answer_is_reasked_as_a_batch_and_counted(make, fresh, sample_call):
    """A model that answers only the first half of every batch: the missing half goes back as
    one batch (not one request per statement), and the partial answers reach llm_calls."""
    context, _ = sample_call
    extractor, _, _ = make(batch_size=8)

    def first_half(request):
        indices = [int(n) for n in re.findall(r"- \[(\d+)\]", request.input_text.rsplit("Statements:", 1)[-1])]
        return {"items": [{"index": i, "valid_at": "2024-08-06T00:00:00Z", "invalid_at": None}
                          for i in indices[:max(1, len(indices) // 2)]]}

    fresh.set_responder(first_half)
    statements = [RawStatement(statement=f"Helio shipped {n} robots this quarter.", statement_type="FACT",
                               temporal_type="DYNAMIC") for n in range(8)]
    ranges = extractor.extract_validity(statements, context)
    assert all(r is not None and r.valid_at is not None for r in ranges)
    stats = extractor.stats("validity")
    # 8 asked: 4 answered; the other 4 as one batch: 2 answered; the last 2 alone.
    assert stats.requests == fresh.stats().requests["responses"] == 4
    assert stats.partial_answers == 2 and not stats.unanswered_items
    row = extractor.usage_row("validity", stats)
    assert row["stage"] == "validity" and row["partial_answers"] == 2 and row["requests"] == 4
