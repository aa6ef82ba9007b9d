"""Batch mode over real HTTP: the Batch API endpoints of the fake server, a sample build in
batch mode against the synchronous one, a kill mid-batch, failed lines and expired batches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import date
from pathlib import Path

import duckdb
import pytest

from fakes.openai_server import OpenAICompatibleServer
from fakes.responders import PipelineResponder
from tkg.core.companies import get_company
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.extract.base import DocumentContext
from tkg.extract.offline import OfflineExtractor
from tkg.ingest.chunking import chunk_transcript
from tkg.ingest.parsing import parse_transcript
from tkg.ingest.sources import load_source
from tkg.llm.batch import BatchFailed, BatchRunner, BatchState
from tkg.llm.cache import ResponseCache
from tkg.llm.client import LLMClient
from tkg.llm.extractor import LLMExtractor
from tkg.llm.settings import LLMSettings
from tkg_assets.instance import open_instance

API_KEY = "sk-test-batch-do-not-leak"
ROOT = Path(__file__).resolve().parents[1]
LIST_PRICE = (0.40, 0.10, 1.60)  # gpt-4.1-mini per million: input, cached input, output


@pytest.fixture
def server():
    with OpenAICompatibleServer(PipelineResponder(), latency_s=0.0, max_in_flight=64, seed=3) as running:
        running.configure(batch_completion_s=0.2)
        yield running


@pytest.fixture(scope="module")
def sample_call():
    row = next(r for r in load_source("sample").rows if r.company == "HLIO" and r.call_date == date(2024, 8, 6))
    transcript = parse_transcript(row, get_company("HLIO"))
    context = DocumentContext.for_transcript(transcript, get_company("HLIO"))
    return context, chunk_transcript(transcript, WordLlamaEmbedder())


def batch_extractor(server, tmp_path, poll_s: float = 0.1) -> tuple[LLMExtractor, LLMClient]:
    settings = LLMSettings(base_url=server.base_url, llm_mode="batch", batch_poll_s=poll_s, batch_size=4, timeout_s=10)
    client = LLMClient(settings, API_KEY)
    client.batches = BatchRunner(client, tmp_path / "llm_batches.sqlite")
    return LLMExtractor(client, ResponseCache(tmp_path / "cache.sqlite")), client


def test_stages_through_batches_match_the_synchronous_answers(server, tmp_path, sample_call):
    context, chunks = sample_call
    extractor, client = batch_extractor(server, tmp_path)
    offline = OfflineExtractor()
    try:
        statements = extractor.extract_statements(chunks, context)
        assert statements == offline.extract_statements(chunks, context)
        flat = [s for per_chunk in statements for s in per_chunk]
        assert extractor.extract_triplets(flat, context) == offline.extract_triplets(flat, context)
    finally:
        client.close()
    served = server.stats()
    # One batch per stage round, no synchronous generation at all.
    assert served.batches_created == 2 and not served.requests.get("responses")
    assert served.batch_lines == len(chunks) + -(-len(flat) // 4)
    usage = extractor.stats("statements")
    assert usage.requests == len(chunks)
    uncached = usage.input_tokens - usage.cached_input_tokens
    list_price = (uncached * LIST_PRICE[0] + usage.cached_input_tokens * LIST_PRICE[1] + usage.output_tokens * LIST_PRICE[2]) / 1e6
    assert usage.cost_usd == pytest.approx(list_price / 2)  # the Batch API's price


def test_failed_lines_are_retried_and_an_expired_batch_is_resubmitted_once(server, tmp_path, sample_call):
    context, chunks = sample_call
    server.configure(p_batch_line_error=0.3, seed=5)
    server.queue_batch_outcomes("expired")
    extractor, client = batch_extractor(server, tmp_path)
    try:
        assert extractor.extract_statements(chunks, context) == OfflineExtractor().extract_statements(chunks, context)
    finally:
        client.close()
    served = server.stats()
    assert served.batch_line_errors > 0 and served.batches_created >= 3  # expired, resubmitted, then error lines again
    assert extractor.stats("statements").unanswered_items.total() == 0


def test_a_batch_expired_twice_fails_the_stage_loudly(server, tmp_path, sample_call):
    context, chunks = sample_call
    server.queue_batch_outcomes("expired", "expired")
    extractor, client = batch_extractor(server, tmp_path)
    try:
        with pytest.raises(BatchFailed, match="expired again"):
            extractor.extract_statements(chunks[:3], context)
    finally:
        client.close()
    assert server.stats().batches_created == 2


def test_a_kill_mid_batch_resumes_the_same_batch(server, tmp_path, sample_call):
    """A process submits a batch and is killed while it waits; the rerun on the same state file
    waits on that batch and submits nothing new."""
    context, chunks = sample_call
    server.configure(batch_completion_s=120)
    child = textwrap.dedent(f"""
        import sys
        from datetime import date
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_batch import batch_extractor, sample_chunks
        from pathlib import Path

        class Server:
            base_url = {server.base_url!r}

        context, chunks = sample_chunks()
        extractor, client = batch_extractor(Server, Path({str(tmp_path)!r}))
        extractor.extract_statements(chunks[:5], context)
        print("finished", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while server.stats().batches_created == 0:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)  # the child is waiting on its batch now
    finally:
        process.kill()
        process.wait()
    assert BatchState(tmp_path / "llm_batches.sqlite").batches()[0][1] != "completed"

    server.configure(batch_completion_s=0.2)  # the provider finishes the pending batch
    extractor, client = batch_extractor(server, tmp_path)
    try:
        statements = extractor.extract_statements(chunks[:5], context)
    finally:
        client.close()
    assert statements == OfflineExtractor().extract_statements(chunks[:5], context)
    served = server.stats()
    assert served.batches_created == 1 and served.files_uploaded == 1  # nothing submitted or paid twice
    assert client.batches.submitted == 0


def sample_chunks():
    """The sample call the tests use, for the child process of the kill test."""
    row = next(r for r in load_source("sample").rows if r.company == "HLIO" and r.call_date == date(2024, 8, 6))
    transcript = parse_transcript(row, get_company("HLIO"))
    return DocumentContext.for_transcript(transcript, get_company("HLIO")), chunk_transcript(transcript, WordLlamaEmbedder())


def test_sample_build_in_batch_mode_gives_the_synchronous_graph(server, tmp_path):
    """`tkg build` of the sample with --llm-mode batch publishes the same facts as the
    synchronous build; its llm_calls rows say 'batch' and cost half the list price, and the
    cost summary shows the saving."""
    graphs, costs, modes, summaries = {}, {}, {}, {}
    for mode in ("sync", "batch"):
        home = tmp_path / mode
        env = {**os.environ, "TKG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"),
               "OPENAI_BASE_URL": server.base_url, "TKG_BATCH_POLL_S": "0.1", "PYTHONPATH": str(ROOT),
               "TKG_SHARDS": "1"}  # the judge's one shard runs in the run's process, the partitions in workers'
        batches_before = server.stats().batches_created
        for name in ("OPENAI_API_KEY", "TKG_LLM", "TKG_EMBEDDINGS", "TKG_LLM_MODE"):
            env.pop(name, None)
        workers = "2" if mode == "batch" else "1"  # batch: the notices come from both kinds of process
        built = subprocess.run([sys.executable, "-m", "tkg.cli", "build", "--workers", workers, "--llm-mode", mode],
                               env=env, capture_output=True, text=True, timeout=900)
        assert built.returncode == 0, built.stderr[-3000:]
        if mode == "batch":  # every batch's progress shows at normal verbosity, and in Dagster's run log
            created = server.stats().batches_created - batches_before
            shown = [line for line in built.stderr.splitlines() if line.startswith("batch ")]  # the CLI's console
            assert sum("submitted" in line for line in shown) == created > 1, built.stderr[-3000:]
            assert sum(": completed," in line for line in shown) == created, built.stderr[-3000:]
            instance = open_instance(home / "dagster_home")
            logged = [entry.user_message for run in instance.get_runs() for entry in instance.all_logs(run.run_id)
                      if entry.user_message.startswith("batch ")]
            assert sum("submitted" in message for message in logged) == created, logged
            assert sum(": completed," in message for message in logged) == created, logged
        with duckdb.connect(str(home / "tkg.duckdb"), read_only=True) as connection:
            graphs[mode] = connection.execute(
                "SELECT company, statement, subject, predicate, object, valid_at, invalid_at FROM facts ORDER BY ALL").fetchall()
            costs[mode] = connection.execute(
                "SELECT sum(estimated_cost_usd), sum(((input_tokens - cached_input_tokens) * ? + cached_input_tokens * ? "
                "+ output_tokens * ?) / 1e6) FROM llm_calls WHERE stage <> 'embeddings'", list(LIST_PRICE)).fetchone()
            modes[mode] = connection.execute(
                "SELECT stage = 'embeddings' AS embeddings, mode, sum(requests) FROM llm_calls GROUP BY ALL ORDER BY ALL").fetchall()
            summaries[mode] = connection.execute(
                "SELECT sum(estimated_cost_usd), sum(sync_cost_usd), sum(saving_usd) FROM llm_cost_summary WHERE mode = ?",
                [mode]).fetchone()
    assert graphs["batch"] == graphs["sync"] and len(graphs["sync"]) > 10
    # estimated_cost_usd is rounded to 6 decimals per row
    assert costs["sync"][0] == pytest.approx(costs["sync"][1], abs=1e-4)
    assert costs["batch"][0] == pytest.approx(costs["batch"][1] / 2, abs=1e-4)
    assert costs["batch"][0] < 0.55 * costs["sync"][0]
    # Every LLM stage's requests went through the Batch API; embeddings stay synchronous.
    assert [(embeddings, mode) for embeddings, mode, _ in modes["batch"]] == [(False, "batch"), (True, "sync")], modes
    assert [(embeddings, mode) for embeddings, mode, _ in modes["sync"]] == [(False, "sync"), (True, "sync")], modes
    cost, sync_cost, saving = summaries["batch"]
    assert sync_cost == pytest.approx(2 * cost, abs=1e-3) and saving == pytest.approx(cost, abs=1e-3) and saving > 0
    assert summaries["sync"][2] == pytest.approx(0, abs=1e-6)
    assert server.stats().batches_created > 0
