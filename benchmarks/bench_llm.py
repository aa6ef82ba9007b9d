"""Side-by-side benchmark: tkg's LLM extraction vs a cookbook-style baseline, against a local
OpenAI-compatible server that behaves like a rate-limited provider.

    python benchmarks/bench_llm.py                     # 3 repeats, 300 ms latency, provider limit 32
    python benchmarks/bench_llm.py --repeats 1 --limit 1 --no-faults   # quick smoke run

The provider is `fakes.openai_server` with `fakes.responders:PipelineResponder`,
started here as a separate process (its CPU does not share this process's GIL): a fixed
latency per request, at most `--max-in-flight` requests in flight and 429 + Retry-After beyond
that, tokens counted as a provider would (about 4 characters per token). Its counters are reset
before every run and read after it, so requests, 429s and tokens are the provider's view and
are measured the same way for both sides.

Input: four consecutive AMD calls of 2017 from ../shared/data/earnings_calls/transcripts.parquet.

Runs (each on a fresh output directory; "fresh" cache = a new empty response cache):
- tkg with its defaults (batch size 8, `max_in_flight` 16: a user does not know the
  provider's limit), fresh cache                                            } side by side,
- cookbook-style baseline (benchmarks/cookbook_baseline.py)                  } `--repeats`
- tkg, defaults but `max_in_flight` above the provider's limit (`--over-limit`,  } times;
  64 against 32), so the adaptive back-off is what keeps it under the limit   } medians
- tkg, batch size 1, fresh cache                                             } are quoted
- tkg, warm-cache rerun (the cache of the first default run; expect 0 requests)
- tkg with its defaults, fresh cache, with random 429s and 500s injected by the server
- the baseline under the same injected faults (skip with --no-baseline-faults)

tkg runs through its library entry point `tkg.build.graph.build_graph` (all four partitions at once,
`concurrent_partitions=4`, one shared `LLMClient`), which also parses, chunks, resolves
entities, judges invalidations and writes Parquet: all of that is inside tkg's wall time. The
baseline's wall time covers its chunking, its LLM requests and its pairwise judge.

Statements lost:
- tkg: statements the run is missing against the reference run (the first fault-free default
  run, which must itself have dropped nothing) plus statements whose validity or triplet
  request never got an answer (`validity_statement_without_answer`,
  `triplets_statement_without_answer`); `chunk_without_usable_answer` is reported too.
- baseline: the statements of every transcript whose extraction failed (one call that failed
  after all its retries fails its transcript, as in the seed), counted as the reference run got
  them from the same chunks.

Lower bound of a run: successful requests x latency / slots, with the provider's slots (it
cannot serve them faster) and, for tkg, also with min(tkg's max_in_flight, provider's slots).

Results go to benchmarks/results/llm.json (every run, plus medians, ratios and target checks)
and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import date, datetime, timezone
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the repository: the fake provider (fakes/) is not installed

from fakes.openai_server import PROVIDER_MODES, REALISTIC_OUTPUT_TOKENS_PER_S, REALISTIC_TTFT_S  # noqa: E402

DATA = Path(os.environ.get("TKG_EARNINGS_CALLS", HERE.parent.parent / "shared" / "data" / "earnings_calls" / "transcripts.parquet"))
CALL_DATES = (date(2017, 1, 31), date(2017, 5, 1), date(2017, 7, 25), date(2017, 10, 24))
COMPANY = "AMD"
API_KEY = "bench-key-not-secret"
LOST_REASONS = ("validity_statement_without_answer", "triplets_statement_without_answer")
PIPELINE_RESPONDER = "fakes.responders:PipelineResponder"
TARGETS = {"speedup": 5.0, "request_ratio": 3.0, "input_token_ratio": 2.0, "bs1_over_lower_bound": 1.5}

log = logging.getLogger("bench_llm")


# --------------------------------------------------------------------------- the provider


class Provider:
    """The local OpenAI-compatible server in its own process, controlled over HTTP."""

    def __init__(self, latency_s: float, max_in_flight: int, retry_after_s: float, url: str | None = None,
                 realistic: dict | None = None, responder: str = PIPELINE_RESPONDER) -> None:
        """`realistic`: the realistic provider's settings (mode, ttft_s, output_tokens_per_s, rpm,
        tpm); None: the slots model (fixed latency, `max_in_flight` slots). `responder`: the
        server's `--responder` (module:attribute) when it is started here."""
        self.latency_s, self.max_in_flight, self.retry_after_s = latency_s, max_in_flight, retry_after_s
        self.realistic = realistic
        self.process: subprocess.Popen | None = None
        if url is None:
            command = [sys.executable, "-m", "fakes.openai_server", "--port", "0", "--latency", str(latency_s),
                       "--max-in-flight", str(max_in_flight), "--retry-after", str(retry_after_s),
                       "--responder", responder, "--log-level", "warning"]
            if realistic:
                command += ["--mode", "realistic", "--rpm", str(realistic["rpm"]), "--tpm", str(realistic["tpm"]),
                            "--ttft", str(realistic["ttft_s"]), "--tokens-per-s", str(realistic["output_tokens_per_s"])]
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line) for line in self.process.stdout], daemon=True).start()
            try:
                first = lines.get(timeout=120)
            except queue.Empty:
                self.close()
                raise RuntimeError("the OpenAI-compatible server did not start within 120 s")
            url = first.strip().rsplit(" ", 1)[-1].removesuffix("/v1")
        self.url = url
        self.base_url = url + "/v1"
        self.http = httpx.Client(base_url=url, timeout=30)
        self.configure(latency_s=latency_s, max_in_flight=None if realistic else max_in_flight, retry_after_s=retry_after_s,
                       p_429=0.0, p_500=0.0, **(realistic or {}))

    def configure(self, **settings) -> dict:
        response = self.http.post("/_configure", json=settings)
        response.raise_for_status()
        return response.json()

    def reset(self) -> None:
        self.http.post("/_reset", json={"prompt_cache": True, "faults": True, "rate_limits": True}).raise_for_status()

    def stats(self) -> dict:
        return self.http.get("/_stats").json()

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server process (Linux), to show whether it was the bottleneck."""
        if self.process is None:
            return None
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class InFlightSampler:
    """Polls the provider's live in-flight count every `interval` seconds from a thread."""

    def __init__(self, url: str, interval: float = 0.1) -> None:
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.t0 = time.perf_counter()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as http:
            while not self._stop.is_set():
                try:
                    self.samples.append((time.perf_counter() - self.t0, int(http.get("/_stats").json()["in_flight"])))
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                self._stop.wait(self.interval)

    def __enter__(self) -> "InFlightSampler":
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        values = [n for t, n in self.samples if start <= t <= end]
        return round(statistics.fmean(values), 1) if values else None

    def share_at_limit(self, limit: int) -> float | None:
        values = [n for _, n in self.samples]
        return round(sum(1 for n in values if n >= limit) / len(values), 3) if values else None


# --------------------------------------------------------------------------- tkg's side


class PhaseRecorder:
    """Wraps tkg's stage runner to record (stage, partition, start, end) spans: every stage's
    function (`tkg.build.stages.compute`: a partition's stage, or a global stage)."""

    def __init__(self) -> None:
        from tkg.build import stages

        self.spans: list[tuple[str, str, float, float]] = []
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()

        def describe(args) -> tuple[str, str]:
            stage, job = args[0], args[1]
            return stage.name, f"{job.partition[0]} {job.partition[1]}" if job.partition else "global"

        stages.compute = self._wrap(describe, stages.compute)

    def _wrap(self, describe, original):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                stage, partition = describe(args)
                with self._lock:
                    self.spans.append((stage, partition, started - self.t0, time.perf_counter() - self.t0))
        return timed

    def start(self) -> None:
        with self._lock:
            self.spans = []
            self.t0 = time.perf_counter()

    def phases(self, sampler: InFlightSampler | None) -> list[dict]:
        """Per stage: first start, last end (seconds from the run's start), and mean in-flight in that window."""
        windows: dict[str, list[float]] = {}
        for stage, _, start, end in self.spans:
            window = windows.setdefault(stage, [start, end])
            window[0], window[1] = min(window[0], start), max(window[1], end)
        rows = []
        for stage, (start, end) in sorted(windows.items(), key=lambda item: item[1][0]):
            rows.append({"stage": stage, "start_s": round(start, 2), "end_s": round(end, 2),
                         "mean_in_flight": sampler.mean(start, end) if sampler else None})
        return rows


class LoopLagProbe:
    """Measures how late tkg's client event loop wakes up (a blocked or starved loop leaves slots idle)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, period: float = 0.02) -> None:
        self.loop, self.period, self.lags_ms = loop, period, []
        self._future = None

    async def _probe(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.period)
            self.lags_ms.append((time.perf_counter() - started - self.period) * 1000)

    def __enter__(self) -> "LoopLagProbe":
        self._future = asyncio.run_coroutine_threadsafe(self._probe(), self.loop)
        return self

    def __exit__(self, *exc) -> None:
        self._future.cancel()

    def summary(self) -> dict:
        lags = sorted(self.lags_ms)
        if not lags:
            return {}
        return {"p50_ms": round(statistics.median(lags), 1), "p95_ms": round(lags[int(0.95 * (len(lags) - 1))], 1),
                "max_ms": round(lags[-1], 1), "share_over_50ms": round(sum(1 for v in lags if v > 50) / len(lags), 3)}


def _recording_judge(client, cache, sink: list):
    from tkg.llm.extractor import LLMJudge

    class RecordingJudge(LLMJudge):
        """tkg's LLMJudge, keeping the cases it was asked about (the candidate pairs for the baseline)."""

        def judge(self, cases):
            sink.extend(cases)
            return super().judge(cases)

    return RecordingJudge(client, cache)


def _merge_stats(components) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for component in components:
        for stage, stats in component.all_stats().items():
            row = merged.setdefault(stage, {"requests": 0, "cache_hits": 0, "input_tokens": 0, "cached_input_tokens": 0,
                                            "output_tokens": 0, "retries": 0, "rate_limited": 0, "reasks": 0,
                                            "dropped": Counter(), "latencies_ms": []})
            for key in ("requests", "cache_hits", "input_tokens", "cached_input_tokens", "output_tokens", "retries",
                        "rate_limited", "reasks"):
                row[key] += getattr(stats, key)
            row["dropped"].update(stats.dropped)
            row["latencies_ms"].extend(stats.latencies_ms)
    out = {}
    for stage, row in merged.items():
        latencies = sorted(row.pop("latencies_ms"))
        row["dropped"] = dict(row["dropped"])
        row["client_latency_p50_ms"] = round(statistics.median(latencies), 1) if latencies else None
        row["client_latency_p95_ms"] = round(latencies[int(0.95 * (len(latencies) - 1))], 1) if latencies else None
        out[stage] = row
    return out


def llm_calls_total(root: Path) -> dict | None:
    """What summing tkg's llm_calls table gives (for the accounting cross-check)."""
    import duckdb

    files = sorted(str(p) for p in root.glob("parquet/llm_calls/**/llm_calls.parquet"))
    if not files:
        return None
    with duckdb.connect() as connection:
        row = connection.sql("SELECT sum(requests), sum(input_tokens), sum(output_tokens) FROM read_parquet($f, union_by_name=true)",
                             params={"f": files}).fetchall()[0]
        # The snapshots are cumulative per extractor: the last (largest) one per partition and stage is the total.
        dedup = connection.sql(
            "SELECT sum(r) FROM (SELECT company, quarter, stage, max(requests) r FROM read_parquet($f, union_by_name=true) "
            "GROUP BY ALL)", params={"f": files}).fetchall()[0]
    return {"sum_requests": int(row[0] or 0), "sum_input_tokens": int(row[1] or 0), "sum_output_tokens": int(row[2] or 0),
            "max_per_partition_stage_requests": int(dedup[0] or 0)}


# --------------------------------------------------------------------------- the bench


def add_provider_arguments(parser: argparse.ArgumentParser) -> None:
    """The provider's options, shared by every benchmark that starts it (bench_llm, bench_graphiti)."""
    parser.add_argument("--provider", choices=PROVIDER_MODES, default="realistic",
                        help="realistic: time to first token + output tokens/s, RPM/TPM budgets with x-ratelimit-* "
                             "headers (default); slots: the older fixed latency and concurrency limit")
    parser.add_argument("--rpm", type=int, default=500, help="realistic: requests per minute (OpenAI tier 1, gpt-4.1-mini)")
    parser.add_argument("--tpm", type=int, default=200_000, help="realistic: tokens per minute (OpenAI tier 1, gpt-4.1-mini)")
    parser.add_argument("--ttft", type=float, default=REALISTIC_TTFT_S, help="realistic: seconds to the first token")
    parser.add_argument("--tokens-per-s", type=float, default=REALISTIC_OUTPUT_TOKENS_PER_S, help="realistic: output tokens per second")
    parser.add_argument("--latency", type=float, default=0.3, help="slots: provider latency per request, seconds")
    parser.add_argument("--max-in-flight", type=int, default=32, help="slots: the provider's limit on requests in flight")
    parser.add_argument("--retry-after", type=float, default=1.0, help="slots: Retry-After the provider sends with a 429")


def realistic_provider(args: argparse.Namespace) -> dict | None:
    """The realistic provider's settings from `add_provider_arguments`' options; None for the slots model."""
    if args.provider == "slots":
        return None
    return {"mode": "realistic", "ttft_s": args.ttft, "output_tokens_per_s": args.tokens_per_s, "rpm": args.rpm,
            "tpm": args.tpm}


class Bench:
    def __init__(self, args: argparse.Namespace, responder: str = PIPELINE_RESPONDER) -> None:
        """`responder`: what the provider started here answers with (ignored with `--server-url`)."""
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="tkg-bench-llm-"))
        self.runs: list[dict] = []
        self.reference: dict | None = None  # statements per chunk and total, from the first fault-free default run
        self.cases: list = []
        self.diagnostics: dict = {}
        self.started = time.perf_counter()

        from tkg.core.embeddings import WordLlamaEmbedder
        from tkg.ingest.sources import load_source, quarter_start

        self.source = load_source(str(DATA))
        rows = [r for r in self.source.rows if r.company == COMPANY and r.call_date in CALL_DATES]
        rows.sort(key=lambda r: r.call_date)
        self.rows = rows[: args.limit]
        missing = sorted(set(CALL_DATES[: args.limit]) - {r.call_date for r in self.rows})
        if missing:
            raise SystemExit(f"transcripts missing from {DATA}: {COMPANY} {missing}")
        self.partitions = [(COMPANY, quarter_start(r.call_date)) for r in self.rows]
        self.chunk_embedder = WordLlamaEmbedder()
        self.chunk_embedder.embed(["warm up the local embedding model"])
        # wordllama calls logging.basicConfig(level=INFO) on import, which would log every HTTP
        # request of both sides to stderr; a benchmark (like any application) sets its own level.
        logging.getLogger().setLevel(logging.WARNING)
        self.phases = PhaseRecorder()
        self.realistic = realistic_provider(args)
        self.provider = Provider(args.latency, args.max_in_flight, args.retry_after, args.server_url, self.realistic,
                                 responder)
        self._warm_up_provider()

    def _warm_up_provider(self) -> None:
        """One request of each kind, so the responder's lazy models are loaded before any timing."""
        import openai
        from cookbook_baseline import EMBEDDING_DIMENSIONS, EMBEDDING_MODEL, MODEL

        from tkg.llm.wire import StatementsOut

        self.provider.configure(latency_s=0.0, ttft_s=0.0)
        with openai.OpenAI(base_url=self.provider.base_url, api_key=API_KEY, max_retries=2) as client:
            client.embeddings.create(model=EMBEDDING_MODEL, dimensions=EMBEDDING_DIMENSIONS, input=["warm up"])
            client.responses.parse(model=MODEL, instructions="x", text_format=StatementsOut,
                                   input='- main entity: Advanced Micro Devices, Inc. (AMD)\n"""\nAMD revenue grew.\n"""')
        self.provider.configure(latency_s=self.args.latency, ttft_s=self.args.ttft)

    def elapsed_min(self) -> float:
        return (time.perf_counter() - self.started) / 60

    def _common(self, record: dict, stats: dict, wall: float, cpu_client: float, cpu_server: float | None,
                sampler: InFlightSampler, load: tuple, client_slots: int | None = None) -> dict:
        """Provider counters and bounds. `client_slots`: the client's own cap on requests in flight, if any."""
        ok = stats["status_200"]
        lower = ok * self.args.latency / self.args.max_in_flight
        slots = min(client_slots, self.args.max_in_flight) if client_slots else self.args.max_in_flight
        client_lower = ok * self.args.latency / slots
        record.update({
            "wall_s": round(wall, 2),
            "requests": stats["total_requests"],
            "requests_by_endpoint": stats["requests"],
            "successful_requests": ok,
            "status_429": stats["status_429"],
            "status_429_limit": stats["status_429_limit"],
            "status_429_injected": stats["status_429_injected"],
            "status_500": stats["status_500"],
            "generation_input_tokens": stats["input_tokens"],
            "embedding_input_tokens": stats["embedding_tokens"],
            "input_tokens": stats["input_tokens"] + stats["embedding_tokens"],
            "cached_input_tokens": stats["cached_tokens"],
            "output_tokens": stats["output_tokens"],
            "lower_bound_s": round(lower, 2),
            "wall_over_lower_bound": round(wall / lower, 2) if lower else None,
            "slots": slots,
            "client_lower_bound_s": round(client_lower, 2),
            "wall_over_client_lower_bound": round(wall / client_lower, 2) if client_lower else None,
            "mean_in_flight": sampler.mean(),
            "share_of_time_at_limit": sampler.share_at_limit(self.args.max_in_flight),
            "max_concurrency": stats["max_concurrency"],
            "client_cpu_s": round(cpu_client, 2),
            "server_cpu_s": round(cpu_server, 2) if cpu_server is not None else None,
            "loadavg_before": load[0], "loadavg_after": os.getloadavg()[0],
        })
        if self.realistic:
            record.update(self._realistic_bound(stats, wall, client_slots))
        # two processes of ours already keep 2 cores busy; much more means other work competed for the CPU
        record["machine_busy"] = max(record["loadavg_before"], record["loadavg_after"]) > 2 * (os.cpu_count() or 1) + 2
        return record

    def _realistic_bound(self, stats: dict, wall: float, client_slots: int | None) -> dict:
        """The bound of a run on the realistic provider: the largest of tokens ÷ TPM, requests ÷
        RPM and Σ latency ÷ the client's slots (no slots: as many as it likes, so the longest
        answer). Also the bound with the first minute's full budget spent at once ("drained"),
        which a run can beat the plain bound by."""
        real = self.realistic
        embeddings = stats["requests"].get("embeddings", 0)
        ok_generation = max(0, stats["status_200"] - embeddings)
        tokens = stats["input_tokens"] + stats["output_tokens"]  # the generation model's budget
        latency = ok_generation * real["ttft_s"] + stats["output_tokens"] / real["output_tokens_per_s"] + embeddings * 0.3
        slots = client_slots or max(1, stats["max_concurrency"])
        terms = {"tokens_over_tpm_s": tokens / real["tpm"] * 60, "requests_over_rpm_s": stats["status_200"] / real["rpm"] * 60,
                 "latency_over_slots_s": latency / slots}
        bound = max(terms.values())
        drained = max((tokens - real["tpm"]) / real["tpm"] * 60, (stats["status_200"] - real["rpm"]) / real["rpm"] * 60,
                      latency / slots, 0.0)
        return {"bound_s": round(bound, 2), "wall_over_bound": round(wall / bound, 3) if bound else None,
                "drained_bound_s": round(drained, 2), "wall_over_drained_bound": round(wall / drained, 3) if drained else None,
                "bound_terms_s": {k: round(v, 2) for k, v in terms.items()},
                "share_429": round(stats["status_429"] / max(1, stats["total_requests"]), 4)}

    # -- tkg ------------------------------------------------------------------------------------

    def run_tkg(self, label: str, batch_size: int | None, cache_path: Path, repeat: int, faults: bool = False,
                profile: bool = False, max_in_flight: int | None = None) -> dict:
        from tkg.build import catalog
        from tkg.build.graph import build_graph
        from tkg.build.stages import Runtime
        from tkg.core import tables
        from tkg.llm.cache import ResponseCache
        from tkg.llm.client import LLMClient
        from tkg.llm.extractor import LLMExtractor, OpenAIEmbedder
        from tkg.llm.settings import LLMSettings
        from tkg.providers import Providers, fingerprints
        from tkg.settings import Settings

        settings = LLMSettings(base_url=self.provider.base_url)  # tkg's defaults, as a user gets them
        max_in_flight = max_in_flight or self.args.tkg_max_in_flight
        if max_in_flight is not None:
            settings = replace(settings, max_in_flight=max_in_flight)
        if batch_size is not None:
            settings = replace(settings, batch_size=batch_size)
        root = Path(tempfile.mkdtemp(prefix=f"{label}-r{repeat}-", dir=self.work))
        cache = ResponseCache(cache_path)
        client = LLMClient(settings, API_KEY)
        resolved = Settings.resolve(home=root / "home", backend="openai", embeddings="openai").with_changes(llm=settings)
        code_versions = catalog.code_versions(fingerprints(resolved))
        components: list = []
        lock = threading.Lock()
        cases: list = []
        judge = _recording_judge(client, cache, cases)

        def make() -> Runtime:
            # what tkg's open_providers() makes for the openai backend, on the bench's client
            made = Providers(LLMExtractor(client, cache), judge, OpenAIEmbedder(client, cache))
            with lock:
                components.extend([made.extractor, made.embedder])
            return Runtime(resolved, made, code_versions, resolved.store())

        self._prepare_provider(faults)
        load = os.getloadavg()
        error = None
        client.run(asyncio.sleep(0))  # start the loop before timing
        profiler = None
        if profile:  # cProfile is per thread: switch it on inside tkg's event-loop thread
            import cProfile

            profiler = cProfile.Profile()

            async def switch(on: bool) -> None:
                profiler.enable() if on else profiler.disable()

            client.run(switch(True))
        with InFlightSampler(self.provider.url) as sampler, LoopLagProbe(client._loop) as lag:
            self.phases.start()
            cpu0, server0, t0 = time.process_time(), self.provider.cpu_seconds(), time.perf_counter()
            try:
                report = build_graph(make(), self.source, self.partitions, concurrent_partitions=len(self.partitions),
                                     make_runtime=make)
            except Exception as exc:  # a crash is a result too
                report, error = None, f"{type(exc).__name__}: {exc}"
                log.exception("tkg run %s failed", label)
            wall = time.perf_counter() - t0
            cpu_client, server1 = time.process_time() - cpu0, self.provider.cpu_seconds()
        stats = self.provider.stats()
        if profiler is not None:
            client.run(switch(False))
        client.close()
        self.provider.configure(p_429=0.0, p_500=0.0)

        stages = _merge_stats(components + [judge])
        dropped = Counter()
        for row in stages.values():
            dropped.update(row["dropped"])
        counts = dict(report.counts) if report else {}
        statements = counts.get("statements_rows", 0)
        record = {"side": "tkg", "config": label, "repeat": repeat, "batch_size": settings.batch_size,
                  "max_in_flight": settings.max_in_flight, "faults": faults, "error": error,
                  "statements": statements, "events": counts.get("temporal_events_rows", 0),
                  "triplets": counts.get("triplets_rows", 0), "judged_pairs": counts.get("judged_pairs", 0),
                  "chunks_dropped": dropped.get("chunk_without_usable_answer", 0),
                  "statements_without_answer": {r: dropped.get(r, 0) for r in LOST_REASONS},
                  "dropped": dict(dropped), "stages": stages,
                  "phases": self.phases.phases(sampler), "loop_lag": lag.summary(),
                  "llm_calls_table": llm_calls_total(root / "home")}
        lost_items = sum(dropped.get(r, 0) for r in (*LOST_REASONS, "chunk_without_usable_answer"))
        if self.reference is None and not faults and error is None and not lost_items:
            chunks = resolved.store().read_all("statements", tables.STATEMENTS, ["chunk_id"]).column("chunk_id").to_pylist()
            self.reference = {"statements": statements, "per_chunk": dict(Counter(chunks)), "from": f"{label} r{repeat}"}
            self.cases = cases
        reference = self.reference["statements"] if self.reference else statements
        missing = max(0, reference - statements)
        record["statements_missing_vs_reference"] = missing
        record["statements_lost"] = missing + sum(record["statements_without_answer"].values())
        self._common(record, stats, wall, cpu_client, None if server0 is None or server1 is None else server1 - server0,
                     sampler, load, client_slots=settings.paced_max_in_flight if self.realistic else settings.max_in_flight)
        record["cache_path"] = str(cache_path)
        if profiler is not None:
            record["loop_profile"] = _profile_rows(profiler)
        self.runs.append(record)
        self._log(record)
        return record

    # -- baseline --------------------------------------------------------------------------------

    def run_baseline(self, label: str, repeat: int, faults: bool = False) -> dict:
        from cookbook_baseline import BaselineTranscript, CookbookBaseline, judge_pairs

        from tkg.core.companies import get_company
        from tkg.extract.base import DocumentContext
        from tkg.ingest.parsing import parse_transcript

        pairs = judge_pairs(self.cases)
        baseline = CookbookBaseline(self.provider.base_url, API_KEY, self.chunk_embedder,
                                    (self.reference or {}).get("per_chunk"))
        self._prepare_provider(faults)
        load = os.getloadavg()
        error = None
        with InFlightSampler(self.provider.url) as sampler:
            cpu0, server0, t0 = time.process_time(), self.provider.cpu_seconds(), time.perf_counter()
            try:
                company = get_company(COMPANY)
                items = []
                for row in self.rows:
                    transcript = parse_transcript(row, company)
                    items.append(BaselineTranscript(transcript, DocumentContext.for_transcript(transcript, company)))
                asyncio.run(baseline.run(items, pairs))
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.exception("baseline run %s failed", label)
            wall = time.perf_counter() - t0
            cpu_client, server1 = time.process_time() - cpu0, self.provider.cpu_seconds()
        stats = self.provider.stats()
        self.provider.configure(p_429=0.0, p_500=0.0)
        summary = baseline.stats.summary()
        record = {"side": "baseline", "config": label, "repeat": repeat, "faults": faults, "error": error,
                  "statements": summary["statements_extracted"], "events": summary["events_built"],
                  "statements_lost": summary["statements_lost"], "transcripts_lost": len(summary["transcripts_lost"]),
                  "judged_pairs": summary["judge_pairs_judged"], "baseline": summary}
        self._common(record, stats, wall, cpu_client, None if server0 is None or server1 is None else server1 - server0,
                     sampler, load)
        self.runs.append(record)
        self._log(record)
        return record

    def _prepare_provider(self, faults: bool) -> None:
        self.provider.reset()
        if faults:
            self.provider.configure(p_429=self.args.p_429, p_500=self.args.p_500, seed=self.args.fault_seed)
        else:
            self.provider.configure(p_429=0.0, p_500=0.0, seed=self.args.fault_seed)

    def _log(self, record: dict) -> None:
        print(f"[{self.elapsed_min():5.1f} min] {record['side']:8s} {record['config']:22s} r{record['repeat']} "
              f"wall {record['wall_s']:7.2f}s  requests {record['requests']:5d}  429s {record['status_429']:5d}  "
              f"in {record['input_tokens']:8d}  out {record['output_tokens']:7d}  lost {record['statements_lost']:4d}  "
              f"LB {record['lower_bound_s']:6.2f}s  in-flight {record['mean_in_flight']}"
              + (f"  slots {record['slots']}" if record["side"] == "tkg" else
                 f"  transcripts lost {record['transcripts_lost']}")
              + (f"  ERROR {record['error']}" if record.get("error") else ""), flush=True)

    # -- the schedule ----------------------------------------------------------------------------

    def run(self) -> dict:
        args = self.args
        budget = args.budget_min
        repeat_minutes = None
        for repeat in range(1, args.repeats + 1):
            if repeat > 1 and repeat_minutes is not None and self.elapsed_min() + repeat_minutes > budget:
                print(f"stopping after {repeat - 1} repeat(s): another would pass the {budget} min budget", flush=True)
                break
            began = self.elapsed_min()
            default_cache = self.work / f"cache-default-r{repeat}.sqlite"
            self.run_tkg("tkg_default_batch", None, default_cache, repeat)
            if args.baseline:
                self.run_baseline("baseline", repeat)
            if args.over_limit:
                self.run_tkg("tkg_over_limit", None, self.work / f"cache-over-r{repeat}.sqlite", repeat,
                             max_in_flight=args.over_limit)
            if args.batch_1:
                self.run_tkg("tkg_batch_1", 1, self.work / f"cache-bs1-r{repeat}.sqlite", repeat)
            repeat_minutes = self.elapsed_min() - began
            if repeat == 1:
                if not args.no_warm:
                    self.run_tkg("tkg_warm_cache", None, default_cache, repeat)
                if not args.no_faults:
                    self.run_tkg("tkg_faults", None, self.work / "cache-faults.sqlite", repeat, faults=True)
                    if not args.no_baseline_faults:
                        self.run_baseline("baseline_faults", repeat, faults=True)
                if args.diagnose:
                    self.diagnostics["client_overhead"] = self.client_overhead()
                    self.run_tkg("tkg_batch_1_profiled", 1, self.work / "cache-profiled.sqlite", repeat, profile=True)
        return self.results()

    # -- diagnostics -----------------------------------------------------------------------------

    def client_overhead(self, count: int = 400) -> dict:
        """Client CPU per request: tkg's request path (LLMClient.structured: limiter, retries, the SDK's
        `responses.parse(text_format=...)`, tkg's lenient parse) against the same request sent with a
        JSON schema built once (`responses.create(text={"format": ...})`) and the body read with
        json.loads, then the same lenient parse. Provider at zero latency and no limit, 32 in flight."""
        import openai
        from cookbook_baseline import MODEL, CookbookBaseline
        from openai.lib._parsing._responses import type_to_text_format_param

        from tkg.core.companies import get_company
        from tkg.core.models import RawStatement
        from tkg.core.results import StageStats
        from tkg.extract.base import DocumentContext
        from tkg.ingest.parsing import parse_transcript
        from tkg.llm.client import LLMClient
        from tkg.llm.settings import LLMSettings
        from tkg.llm.wire import ValidityOut, parse_validity

        company = get_company(COMPANY)
        transcript = parse_transcript(self.rows[0], company)
        context = DocumentContext.for_transcript(transcript, company)
        statement = RawStatement(statement="Advanced Micro Devices revenue for the fourth quarter of 2016 was $1.11 billion.",
                                 statement_type="FACT", temporal_type="STATIC")
        prompt = CookbookBaseline.validity_prompt(statement, context)
        self.provider.reset()
        self.provider.configure(latency_s=0.0, max_in_flight=None, p_429=0.0, p_500=0.0)
        out: dict = {"requests_each": count, "schema": "ValidityOut"}
        try:
            client = LLMClient(LLMSettings(base_url=self.provider.base_url, max_in_flight=32), API_KEY)
            stats = StageStats()

            async def tkg_path(n: int) -> None:
                await asyncio.gather(*(client.structured("validity", prompt, ValidityOut,
                                                         lambda text: parse_validity(text, [0], stats), stats)
                                       for _ in range(n)))

            client.run(tkg_path(20))
            cpu, wall = time.process_time(), time.perf_counter()
            client.run(tkg_path(count))
            out["tkg_path_cpu_ms_per_request"] = round((time.process_time() - cpu) / count * 1000, 2)
            out["tkg_path_requests_per_s"] = round(count / (time.perf_counter() - wall), 1)
            client.close()

            text_format = type_to_text_format_param(ValidityOut)

            async def lean_path(n: int) -> None:
                semaphore = asyncio.Semaphore(32)
                async with openai.AsyncOpenAI(base_url=self.provider.base_url, api_key=API_KEY, max_retries=0) as sdk:
                    async def one() -> None:
                        async with semaphore:
                            raw = await sdk.responses.with_raw_response.create(
                                model=MODEL, temperature=0, text={"format": text_format},
                                instructions=prompt.instructions, input=prompt.input)
                            body = json.loads(raw.text)
                            text = "".join(part.get("text", "") for item in body["output"] if item.get("type") == "message"
                                           for part in item.get("content") or [])
                            parse_validity(text, [0], StageStats())
                    await asyncio.gather(*(one() for _ in range(n)))

            asyncio.run(lean_path(20))
            cpu, wall = time.process_time(), time.perf_counter()
            asyncio.run(lean_path(count))
            out["schema_once_cpu_ms_per_request"] = round((time.process_time() - cpu) / count * 1000, 2)
            out["schema_once_requests_per_s"] = round(count / (time.perf_counter() - wall), 1)
            started = time.perf_counter()
            for _ in range(200):
                type_to_text_format_param(ValidityOut)
            out["sdk_schema_generation_ms_per_call"] = round((time.perf_counter() - started) / 200 * 1000, 2)
            out["needed_cpu_ms_per_request_to_keep_limit_busy"] = round(self.args.latency / self.args.max_in_flight * 1000, 2)
        finally:
            self.provider.configure(latency_s=self.args.latency, max_in_flight=self.args.max_in_flight)
        print(f"[{self.elapsed_min():5.1f} min] client overhead: {out}", flush=True)
        return out

    # -- results ---------------------------------------------------------------------------------

    def results(self) -> dict:
        by_config: dict[str, list[dict]] = defaultdict(list)
        for record in self.runs:
            by_config[record["config"]].append(record)
        metrics = ("wall_s", "requests", "successful_requests", "status_429", "status_500", "input_tokens",
                   "generation_input_tokens", "embedding_input_tokens", "cached_input_tokens", "output_tokens",
                   "statements", "statements_lost", "transcripts_lost", "lower_bound_s", "wall_over_lower_bound",
                   "max_in_flight", "slots", "client_lower_bound_s", "wall_over_client_lower_bound", "mean_in_flight",
                   "client_cpu_s", "server_cpu_s", "bound_s", "wall_over_bound", "drained_bound_s",
                   "wall_over_drained_bound", "share_429")
        medians = {}
        for config, records in by_config.items():
            medians[config] = {"runs": len(records)}
            for metric in metrics:
                values = [r[metric] for r in records if r.get(metric) is not None]
                medians[config][metric] = statistics.median(values) if values else None
            medians[config]["statements_lost_max"] = max(r["statements_lost"] for r in records)

        # ratios measured side by side: baseline / tkg within each repeat, then the median
        def side_by_side(ours_config: str) -> dict[str, list[float]]:
            paired = defaultdict(dict)
            for record in self.runs:
                if record["config"] in ("baseline", ours_config):
                    paired[record["repeat"]][record["config"]] = record
            ratios = defaultdict(list)
            for pair in paired.values():
                if len(pair) == 2:
                    base, ours = pair["baseline"], pair[ours_config]
                    ratios["speedup"].append(base["wall_s"] / ours["wall_s"])
                    ratios["request_ratio"].append(base["requests"] / max(1, ours["requests"]))
                    ratios["successful_request_ratio"].append(base["successful_requests"] / max(1, ours["successful_requests"]))
                    ratios["input_token_ratio"].append(base["input_tokens"] / max(1, ours["input_tokens"]))
                    ratios["output_token_ratio"].append(base["output_tokens"] / max(1, ours["output_tokens"]))
            return ratios

        ratios = side_by_side("tkg_default_batch")
        ratio_medians = {k: round(statistics.median(v), 2) for k, v in ratios.items()}
        over_ratios = side_by_side("tkg_over_limit")
        over_medians = {k: round(statistics.median(v), 2) for k, v in over_ratios.items()}

        def lost_zero(config: str) -> bool | None:
            records = by_config.get(config)
            return None if not records else all(r["statements_lost"] == 0 and not r.get("error") for r in records)

        bs1 = medians.get("tkg_batch_1", {})
        warm = by_config.get("tkg_warm_cache", [])
        targets = {
            "tkg >= 5x faster than baseline": _check(ratio_medians.get("speedup"), TARGETS["speedup"]),
            "tkg >= 3x fewer requests": _check(ratio_medians.get("request_ratio"), TARGETS["request_ratio"]),
            "tkg >= 2x fewer input tokens": _check(ratio_medians.get("input_token_ratio"), TARGETS["input_token_ratio"]),
            "tkg loses 0 statements at the provider limit (defaults, over the limit, batch 1)": {
                "measured": {c: [r["statements_lost"] for r in by_config.get(c, [])]
                             for c in ("tkg_default_batch", "tkg_over_limit", "tkg_batch_1")},
                "pass": all(lost_zero(c) is not False for c in ("tkg_default_batch", "tkg_over_limit", "tkg_batch_1"))
                and lost_zero("tkg_default_batch") is True},
            "tkg loses 0 statements under injected 429s/500s": {
                "measured": [r["statements_lost"] for r in by_config.get("tkg_faults", [])], "pass": lost_zero("tkg_faults")},
            "tkg batch 1 within 1.5x of its lower bound at its own slots": {
                "measured": bs1.get("wall_over_client_lower_bound"),
                "at_provider_slots": bs1.get("wall_over_lower_bound"),
                "pass": None if bs1.get("wall_over_client_lower_bound") is None
                else bs1["wall_over_client_lower_bound"] <= TARGETS["bs1_over_lower_bound"]},
            "warm-cache rerun makes 0 requests": {
                "measured": [r["requests"] for r in warm], "pass": None if not warm else all(r["requests"] == 0 for r in warm)},
        }
        return {
            "benchmark": "tkg LLM extraction vs cookbook-style baseline",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "cpu_model": _cpu_model(), "note": "shared machine: see loadavg_before/after per run"},
            "tkg_max_in_flight": {"default_runs": self.args.tkg_max_in_flight or "tkg default (LLMSettings)",
                                  "over_limit_run": self.args.over_limit or None},
            "provider_model": self.realistic or "slots",
            "provider": {"latency_s": self.args.latency, "max_in_flight": self.args.max_in_flight,
                         "retry_after_s": self.args.retry_after, "injected_faults": {"p_429": self.args.p_429,
                                                                                     "p_500": self.args.p_500,
                                                                                     "seed": self.args.fault_seed},
                         "responder": "fakes.responders:PipelineResponder", "separate_process": self.provider.process is not None},
            "input": {"source": str(DATA), "company": COMPANY, "calls": [r.call_date.isoformat() for r in self.rows]},
            "reference": {k: v for k, v in (self.reference or {}).items() if k != "per_chunk"},
            "judge_pairs_from_tkg": sum(len(c.candidates) for c in self.cases),
            "medians": medians,
            "side_by_side_ratios": {"median": ratio_medians, "per_repeat": {k: [round(x, 2) for x in v] for k, v in ratios.items()}},
            "side_by_side_ratios_over_limit": {"median": over_medians,
                                               "per_repeat": {k: [round(x, 2) for x in v] for k, v in over_ratios.items()}},
            "targets": targets,
            "diagnostics": self.diagnostics,
            "runs": self.runs,
            "total_minutes": round(self.elapsed_min(), 1),
        }

    def close(self) -> None:
        self.provider.close()
        if not self.args.keep_tmp:
            import shutil

            shutil.rmtree(self.work, ignore_errors=True)


def _profile_rows(profiler, limit: int = 25) -> dict:
    """The loop thread's profile: time idle in epoll, and the top functions by cumulative time."""
    import pstats

    stats = pstats.Stats(profiler)
    total = stats.total_tt
    rows, idle = [], 0.0
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.stats.items():
        where = f"{filename.split('site-packages/')[-1].replace(str(HERE.parent) + '/', '')}:{line}({name})"
        if name == "poll" or "epoll" in name:
            idle += own
        rows.append((cumulative, own, calls, where))
    rows.sort(reverse=True)
    own = sorted(rows, key=lambda row: row[1], reverse=True)
    return {"profiled_seconds": round(total, 2), "idle_in_epoll_s": round(idle, 2),
            "top_cumulative": [{"function": w, "calls": c, "cumulative_s": round(cu, 2), "own_s": round(o, 2)}
                               for cu, o, c, w in rows[:limit]],
            "top_own": [{"function": w, "calls": c, "own_s": round(o, 2)} for _, o, c, w in own[:15]]}


def _check(measured: float | None, target: float) -> dict:
    return {"measured": measured, "target": target, "pass": None if measured is None else measured >= target}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


LABELS = {
    "baseline": "cookbook-style baseline",
    "tkg_default_batch": "tkg, defaults (batch size 8)",
    "tkg_over_limit": "tkg, defaults, max_in_flight over the provider's limit",
    "tkg_batch_1": "tkg, batch size 1",
    "tkg_warm_cache": "tkg, warm-cache rerun",
    "tkg_faults": "tkg, 20% 429 + 5% 500 injected",
    "baseline_faults": "baseline, 20% 429 + 5% 500 injected",
}


def markdown_realistic(results: dict) -> list[str]:
    medians = results["medians"]
    lines = ["| run | runs | wall s | requests | 429s (share) | input tokens | output tokens | statements lost | "
             "bound s | wall / bound | drained bound s | wall / drained bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda v, d=0: "n/a" if v is None else (f"{v:,.{d}f}" if isinstance(v, (int, float)) else str(v))
    for config in [c for c in LABELS if c in medians]:
        m = medians[config]
        lines.append(f"| {LABELS[config]} | {m['runs']} | {fmt(m['wall_s'], 1)} | {fmt(m['requests'])} | "
                     f"{fmt(m['status_429'])} ({fmt((m['share_429'] or 0) * 100, 1)}%) | {fmt(m['input_tokens'])} | "
                     f"{fmt(m['output_tokens'])} | {fmt(m['statements_lost'])} | {fmt(m['bound_s'], 1)} | "
                     f"{fmt(m['wall_over_bound'], 2)} | {fmt(m['drained_bound_s'], 1)} | {fmt(m['wall_over_drained_bound'], 2)} |")
    return lines


def markdown(results: dict) -> str:
    medians = results["medians"]
    if results.get("provider_model") not in (None, "slots"):
        lines = markdown_realistic(results)
        for title, key in (("tkg defaults", "side_by_side_ratios"),):
            if results[key]["median"]:
                lines += ["", f"Side by side (baseline / {title}, median over repeats): "
                          + ", ".join(f"{k} {v}x" for k, v in results[key]["median"].items())]
        lines += ["", "| target | measured | result |", "|---|---|---|"]
        for name, check in results["targets"].items():
            verdict = "n/a" if check["pass"] is None else ("PASS" if check["pass"] else "FAIL")
            lines.append(f"| {name} | {check['measured']} | {verdict} |")
        return "\n".join(lines)
    order = [c for c in LABELS if c in medians]
    slots = results["provider"]["max_in_flight"]
    lines = [(f"| run | runs | client max in flight | wall s | requests | 429s | 500s | input tokens | output tokens | "
              f"statements lost | lower bound s (÷{slots}) | wall / bound | bound at own slots s | mean in flight |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda v, d=0: "n/a" if v is None else (f"{v:,.{d}f}" if isinstance(v, (int, float)) else str(v))
    for config in order:
        m = medians[config]
        own_bound = m["client_lower_bound_s"] if m["max_in_flight"] and m["max_in_flight"] < slots else None
        lines.append(f"| {LABELS[config]} | {m['runs']} | {fmt(m['max_in_flight']) if m['max_in_flight'] else 'none'} | "
                     f"{fmt(m['wall_s'], 1)} | {fmt(m['requests'])} | {fmt(m['status_429'])} | "
                     f"{fmt(m['status_500'])} | {fmt(m['input_tokens'])} | {fmt(m['output_tokens'])} | "
                     f"{fmt(m['statements_lost'])} | {fmt(m['lower_bound_s'], 1)} | {fmt(m['wall_over_lower_bound'], 2)} | "
                     f"{fmt(own_bound, 1) if own_bound is not None else '='} | {fmt(m['mean_in_flight'], 1)} |")
    for title, key in (("tkg defaults", "side_by_side_ratios"), ("tkg over the limit", "side_by_side_ratios_over_limit")):
        ratios = results[key]["median"]
        if ratios:
            lines.append("")
            lines.append(f"Side by side (baseline / {title}, median over repeats): "
                         + ", ".join(f"{k} {v}x" for k, v in ratios.items()))
    lines.append("")
    lines.append("| target | measured | result |")
    lines.append("|---|---|---|")
    for name, check in results["targets"].items():
        verdict = "n/a" if check["pass"] is None else ("PASS" if check["pass"] else "FAIL")
        lines.append(f"| {name} | {check['measured']} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the side-by-side runs (medians quoted)")
    add_provider_arguments(parser)
    parser.add_argument("--tkg-max-in-flight", type=int, default=None,
                        help="tkg's max_in_flight (default: tkg's own default, as a user who does not know the limit gets)")
    parser.add_argument("--over-limit", type=int, default=64,
                        help="also run tkg with this max_in_flight, above the provider's limit, every repeat (0: skip)")
    parser.add_argument("--limit", type=int, default=4, help="number of the four 2017 AMD calls to use")
    parser.add_argument("--no-batch-1", dest="batch_1", action="store_false", help="skip the batch-size-1 runs")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="tkg's runs only (e.g. to re-measure tkg after a change; no side-by-side ratios)")
    parser.add_argument("--p-429", type=float, default=0.2)
    parser.add_argument("--p-500", type=float, default=0.05)
    parser.add_argument("--fault-seed", type=int, default=1)
    parser.add_argument("--no-warm", action="store_true")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--no-baseline-faults", action="store_true")
    parser.add_argument("--budget-min", type=float, default=25.0, help="start no repeat that would end past this")
    parser.add_argument("--server-url", default=None, help="use a running server (with PipelineResponder) instead")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "llm.json")
    parser.add_argument("--keep-tmp", action="store_true")
    parser.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                        help="skip the diagnostics: tkg's client CPU per request, and an extra batch-1 run with "
                             "tkg's event loop under cProfile (reported apart, not in the targets)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not DATA.exists():
        print(f"SKIPPED: {DATA} not found (the real earnings-call corpus lives in ../shared; "
              "set TKG_EARNINGS_CALLS to its transcripts.parquet)")
        return 0
    return run_and_report(Bench(args), args.out, markdown)


def run_and_report(bench, out: Path, render) -> int:
    """Run a side-by-side benchmark (closing its servers whatever happens), write its JSON to
    `out` and print its tables (`render`)."""
    try:
        results = bench.run()
    finally:
        bench.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print()
    print(render(results))
    print(f"\nwritten {out} ({results['total_minutes']} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
