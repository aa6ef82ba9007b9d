"""Graphiti side by side with tkg and the cookbook-style baseline, on the LLM benchmark's
provider and calls.

    python benchmarks/bench_graphiti.py --limit 1                  # realistic provider, tier 1 (the default)
    python benchmarks/bench_graphiti.py --provider slots           # the older slots model: 300 ms, 32 slots

Needs the `bench` extra (`pip install -e '.[bench]'`: graphiti-core 0.31.2, kuzu 0.11.3, httpx).

One provider process (`fakes.openai_server`, configured by bench_llm's own provider options and
code: by default the realistic provider, time to first token + output tokens at a fixed rate,
OpenAI tier-1 budgets of 500 RPM and 200k TPM with x-ratelimit-* headers and 429 +
retry-after-ms beyond; `--provider slots`: 300 ms per request, 32 slots, 429 + Retry-After
beyond) answers every side under the same limits: tkg's and the baseline's schemas with
`PipelineResponder`, Graphiti's with `GraphitiResponder` (fakes/graphiti_responder.py,
answers shaped like a real model's: see benchmarks/README.md). Runs, one after another, each
on a fresh graph:

1. tkg with its defaults (`bench_llm.Bench.run_tkg`, as in bench_llm.py);
2. the cookbook-style baseline (`bench_llm.Bench.run_baseline`: it judges the pairs tkg's run
   judged, so it runs second);
3. Graphiti, one message episode per speaker turn, `add_episode` one by one, awaited in order
   (Graphiti's documented ingestion discipline), on its embedded Kuzu driver;
4. Graphiti, the same episodes, one `add_episode_bulk` per call, calls in order.

Graphiti runs as its documentation shows for transcripts (examples/podcast): `EpisodeType.message`,
body `"Speaker (title, organisation): text"`, the call's time (plus a minute per turn, to keep
the turns in order) as `reference_time`; default entity types, default `SEMAPHORE_LIMIT`; no
`group_id` (on Kuzu it fails: getzep/graphiti#1258). Its OpenAI client, embedder and reranker
all point at the provider.

Per run: wall time, the provider's view (requests by endpoint, 429s, tokens), the provider's
answers by schema (requests, tokens) and the time from the first to the last request, the
bound bench_llm computes (realistic: the largest of tokens / TPM, requests / RPM and
Σ latency / the run's slots; slots model: successful requests x latency / slots) and the wall
time over it, and what ended up in the graph. Results: benchmarks/results/graphiti_realistic.json
(slots model: graphiti.json) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")  # no phoning home from a benchmark

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_llm  # noqa: E402  (after the path and the telemetry switch)
from bench_llm import API_KEY, COMPANY, DATA, InFlightSampler  # noqa: E402

RESPONDER = "fakes.graphiti_responder:BenchResponder"
MODEL = "gpt-4.1-mini"  # the model tkg and the baseline ask for
log = logging.getLogger("bench_graphiti")


# --------------------------------------------------------------------------- the provider


def responder_control(provider: bench_llm.Provider, schema: str) -> dict:
    """A control request to `BenchResponder` (its tally, or a reset). It is one request to the
    provider: send it before the provider's counters are reset, or after they are read."""
    body = {"model": MODEL, "input": "control", "text": {"format": {"type": "json_schema", "name": schema,
                                                                    "schema": {"type": "object"}}}}
    response = provider.http.post("/v1/responses", json=body)
    response.raise_for_status()
    text = "".join(part["text"] for item in response.json()["output"] for part in item.get("content") or [])
    return json.loads(text)


# --------------------------------------------------------------------------- Graphiti's side


def episodes_of(transcript) -> list[dict]:
    """One message episode per speaker turn, as Graphiti's podcast example builds them."""
    episodes = []
    for number, turn in enumerate(transcript.turns):
        about = ", ".join(part for part in (turn.title, turn.organization) if part)
        speaker = f"{turn.speaker} ({about})" if about else turn.speaker
        episodes.append({
            "name": f"{transcript.company} {transcript.call_date} turn {number}",
            "content": f"{speaker}: {turn.text}",
            "source_description": f"{transcript.company_name} earnings call transcript ({transcript.title})",
            "reference_time": transcript.call_datetime + timedelta(minutes=number),
        })
    return episodes


class InvalidationCounter:
    """Counts the edges Graphiti expires because a newer edge contradicts them (the return of
    `resolve_edge_contradictions`, which both ingestion paths call)."""

    def __init__(self) -> None:
        from graphiti_core.utils.maintenance import edge_operations

        self.module, self.original = edge_operations, edge_operations.resolve_edge_contradictions
        self.uuids: set[str] = set()

    def __enter__(self) -> "InvalidationCounter":
        def counting(resolved_edge, candidates):
            invalidated = self.original(resolved_edge, candidates)
            self.uuids.update(edge.uuid for edge in invalidated)
            return invalidated

        self.module.resolve_edge_contradictions = counting
        return self

    def __exit__(self, *exc) -> None:
        self.module.resolve_edge_contradictions = self.original


async def graphiti_ingest(mode: str, base_url: str, transcripts: list, folder: Path,
                          max_coroutines: int | None = None) -> dict:
    """Build one Graphiti graph from `transcripts` in `mode` ('one_by_one' or 'bulk'); what is in it.
    `max_coroutines`: Graphiti's own cap on its concurrent requests (None: its SEMAPHORE_LIMIT, 20)."""
    from graphiti_core import Graphiti
    from graphiti_core.cross_encoder.openai_reranker_client import OpenAIRerankerClient
    from graphiti_core.driver.kuzu_driver import KuzuDriver
    from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig
    from graphiti_core.llm_client import LLMConfig, OpenAIClient
    from graphiti_core.nodes import EpisodeType
    from graphiti_core.utils.bulk_utils import RawEpisode

    config = LLMConfig(api_key=API_KEY, base_url=base_url, model=MODEL, small_model=MODEL)
    driver = KuzuDriver(db=str(folder / "graph.kuzu"))
    graphiti = Graphiti(graph_driver=driver, llm_client=OpenAIClient(config=config),
                        embedder=OpenAIEmbedder(OpenAIEmbedderConfig(api_key=API_KEY, base_url=base_url)),
                        cross_encoder=OpenAIRerankerClient(config=config), max_coroutines=max_coroutines)
    # Kuzu's schema is made with the driver; its full-text indices are not (graphiti.build_indices_and_constraints
    # is a no-op on Kuzu in 0.31.2)
    await driver.graph_ops.build_indices_and_constraints(driver)
    episodes_added = 0
    for transcript in transcripts:
        episodes = episodes_of(transcript)
        if mode == "one_by_one":
            for episode in episodes:
                await graphiti.add_episode(name=episode["name"], episode_body=episode["content"],
                                           source_description=episode["source_description"],
                                           reference_time=episode["reference_time"], source=EpisodeType.message)
        else:
            await graphiti.add_episode_bulk([RawEpisode(source=EpisodeType.message, **episode) for episode in episodes])
        episodes_added += len(episodes)
    counts = await graph_counts(driver)
    counts["episodes_added"] = episodes_added
    await graphiti.close()
    for client in (graphiti.llm_client.client, graphiti.embedder.client, graphiti.cross_encoder.client):
        await client.close()  # before asyncio.run closes the loop under their connections
    return counts


async def graph_counts(driver) -> dict:
    queries = {
        "episodes": "MATCH (e:Episodic) RETURN count(e) AS n",
        "entities": "MATCH (n:Entity) RETURN count(n) AS n",
        "edges": "MATCH (e:RelatesToNode_) RETURN count(e) AS n",
        "edges_with_invalid_at": "MATCH (e:RelatesToNode_) WHERE e.invalid_at IS NOT NULL RETURN count(e) AS n",
        "edges_expired": "MATCH (e:RelatesToNode_) WHERE e.expired_at IS NOT NULL RETURN count(e) AS n",
        "edges_in_several_episodes": "MATCH (e:RelatesToNode_) WHERE size(e.episodes) > 1 RETURN count(e) AS n",
        "mentions": "MATCH (:Episodic)-[m:MENTIONS]->(:Entity) RETURN count(m) AS n",
    }
    counts = {}
    for name, query in queries.items():
        rows, _, _ = await driver.execute_query(query)
        counts[name] = rows[0]["n"] if rows else 0
    rows, _, _ = await driver.execute_query("MATCH (e:RelatesToNode_) RETURN e.name AS name, count(e) AS n")
    counts["edges_by_relation"] = dict(sorted(((row["name"], row["n"]) for row in rows), key=lambda item: -item[1]))
    return counts


# --------------------------------------------------------------------------- the runs


class SideBySide:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.perf_counter()
        # bench_llm's harness with this benchmark's provider options and responder: its provider,
        # run_tkg and run_baseline are the LLM benchmark's
        options = argparse.Namespace(**{
            **vars(args), "repeats": 1, "tkg_max_in_flight": None, "over_limit": 0, "p_429": 0.0, "p_500": 0.0,
            "fault_seed": 1, "no_warm": True, "no_faults": True, "no_baseline_faults": True, "budget_min": 1e9,
            "server_url": None, "diagnose": False})
        self.bench = bench_llm.Bench(options, responder=RESPONDER)
        self.records: list[dict] = []

    def elapsed_min(self) -> float:
        return (time.perf_counter() - self.started) / 60

    def _tally(self, record: dict) -> dict:
        """The responder's per-schema tally for the run just finished, then a reset for the next."""
        tally = responder_control(self.bench.provider, "ResponderTally")
        responder_control(self.bench.provider, "ResponderReset")
        first, last = tally.pop("first_answer"), tally.pop("last_answer")
        record["by_schema"] = dict(sorted(tally.pop("by_schema").items(), key=lambda item: -item[1]["requests"]))
        # slots: the responder answers one latency after a request arrives; realistic: on arrival
        # (the answer's generation time follows)
        delay = 0.0 if self.bench.realistic else self.args.latency
        record["first_to_last_request_s"] = round(last - first + delay, 2) if first and last else None
        record["responder"] = tally
        return record

    def run_tkg(self) -> dict:
        import tkg.build.graph

        captured: dict = {}
        original = tkg.build.graph.build_graph

        def capturing(*args, **kwargs):
            report = original(*args, **kwargs)
            captured.update(report.counts)
            return report

        responder_control(self.bench.provider, "ResponderReset")
        tkg.build.graph.build_graph = capturing
        try:
            record = self.bench.run_tkg("tkg_default_batch", None, self.bench.work / "cache-tkg.sqlite", 1)
        finally:
            tkg.build.graph.build_graph = original
        record["graph"] = {key: value for key, value in sorted(captured.items())}
        return self._finish(record)

    def run_baseline(self) -> dict:
        responder_control(self.bench.provider, "ResponderReset")
        return self._finish(self.bench.run_baseline("baseline", 1))

    def run_graphiti(self, mode: str) -> dict:
        from tkg.core.companies import get_company
        from tkg.ingest.parsing import parse_transcript

        company = get_company(COMPANY)
        transcripts = [parse_transcript(row, company) for row in self.bench.rows]
        folder = Path(tempfile.mkdtemp(prefix=f"graphiti-{mode}-", dir=self.bench.work))
        responder_control(self.bench.provider, "ResponderReset")
        self.bench._prepare_provider(False)
        load = os.getloadavg()
        error, counts = None, {}
        with InFlightSampler(self.bench.provider.url) as sampler, InvalidationCounter() as invalidations:
            cpu0, server0, t0 = time.process_time(), self.bench.provider.cpu_seconds(), time.perf_counter()
            try:
                counts = asyncio.run(graphiti_ingest(mode, self.bench.provider.base_url, transcripts, folder,
                                                     self.args.graphiti_max_coroutines))
            except Exception as exc:  # a crash is a result too
                error = f"{type(exc).__name__}: {exc}"
                log.exception("Graphiti %s failed", mode)
            wall = time.perf_counter() - t0
            cpu_client, server1 = time.process_time() - cpu0, self.bench.provider.cpu_seconds()
        stats = self.bench.provider.stats()
        counts["edges_invalidated_by_contradiction"] = len(invalidations.uuids)
        record = {"side": "graphiti", "config": f"graphiti_{mode}", "repeat": 1, "error": error, "graph": counts,
                  "statements_lost": 0, "episodes": sum(len(t.turns) for t in transcripts),
                  "graphiti_max_coroutines": self.args.graphiti_max_coroutines}
        self.bench._common(record, stats, wall, cpu_client, None if server0 is None or server1 is None else server1 - server0,
                           sampler, load)
        return self._finish(record)

    def _finish(self, record: dict) -> dict:
        self._tally(record)
        self.records.append(record)
        # the runs so far, so a benchmark cut short (a Graphiti run takes long at tier 1) leaves them
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(json.dumps(self.results(), indent=2, default=str) + "\n")
        print(f"[{self.elapsed_min():5.1f} min] {record['config']:22s} wall {record['wall_s']:8.2f}s  "
              f"requests {record['requests']:6d}  429s {record['status_429']:5d}  in {record['input_tokens']:9d}  "
              f"out {record['output_tokens']:8d}  LB {record.get('bound_s', record['lower_bound_s']):6.2f}s  "
              f"first-to-last {record['first_to_last_request_s']}s  in-flight {record['mean_in_flight']}"
              + (f"  ERROR {record['error']}" if record.get("error") else ""), flush=True)
        return record

    def run(self) -> dict:
        self.run_tkg()
        if not self.args.no_baseline:
            self.run_baseline()
        for mode in self.args.modes:
            self.run_graphiti(mode)
        return self.results()

    def results(self) -> dict:
        by_config = {record["config"]: record for record in self.records}
        tkg_record = by_config["tkg_default_batch"]
        ratios = {}
        for config, record in by_config.items():
            if config == "tkg_default_batch":
                continue
            ratios[f"{config} / tkg"] = {
                "wall": round(record["wall_s"] / tkg_record["wall_s"], 2),
                "requests": round(record["requests"] / max(1, tkg_record["requests"]), 2),
                "successful_requests": round(record["successful_requests"] / max(1, tkg_record["successful_requests"]), 2),
                "input_tokens": round(record["input_tokens"] / max(1, tkg_record["input_tokens"]), 2),
                "output_tokens": round(record["output_tokens"] / max(1, tkg_record["output_tokens"]), 2),
            }
            if record.get("bound_s") and tkg_record.get("bound_s"):
                ratios[f"{config} / tkg"]["bound"] = round(record["bound_s"] / tkg_record["bound_s"], 2)
        return {
            "benchmark": "Graphiti (one by one and bulk) side by side with tkg and the cookbook-style baseline",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "note": "shared machine: see loadavg_before/after per run"},
            "provider_model": self.bench.realistic or "slots",
            "provider": {"latency_s": self.args.latency, "max_in_flight": self.args.max_in_flight,
                         "retry_after_s": self.args.retry_after, "responder": RESPONDER, "separate_process": True},
            "graphiti": {"version": _version("graphiti-core"), "kuzu": _version("kuzu"), "model": MODEL,
                         "episodes": "one message episode per speaker turn", "modes": self.args.modes},
            "input": {"source": str(DATA), "company": COMPANY, "calls": [r.call_date.isoformat() for r in self.bench.rows]},
            "ratios_to_tkg": ratios,
            "runs": self.records,
            "total_minutes": round(self.elapsed_min(), 1),
        }

    def close(self) -> None:
        self.bench.close()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


LABELS = {"baseline": "cookbook-style baseline", "graphiti_one_by_one": "Graphiti, add_episode one by one",
          "graphiti_bulk": "Graphiti, add_episode_bulk per call", "tkg_default_batch": "tkg, defaults"}


def markdown(results: dict) -> str:
    fmt = lambda v, d=0: "n/a" if v is None else f"{v:,.{d}f}"
    realistic = results.get("provider_model") not in (None, "slots")
    # realistic: bench_llm's bound, max(tokens ÷ TPM, requests ÷ RPM, Σ latency ÷ slots), and the
    # same with the first minute's full budgets spent at once ("drained")
    bound_keys = (("bound_s", "wall_over_bound"), ("drained_bound_s", "wall_over_drained_bound")) if realistic else \
        (("lower_bound_s", "wall_over_lower_bound"),)
    bound_titles = "bound s | wall / bound | drained bound s | wall / drained bound" if realistic else \
        f"lower bound s (÷{results['provider']['max_in_flight']}) | wall / bound"
    lines = [f"| run | wall s | first→last request s | requests | 429s | input tokens | output tokens | {bound_titles} | "
             "mean in flight | entities | facts / edges | invalidated |",
             "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(bound_keys)) + "---:|---:|---:|---:|"]
    for record in results["runs"]:
        graph = record.get("graph", {})
        if record["side"] == "graphiti":
            entities, facts, invalidated = graph.get("entities"), graph.get("edges"), graph.get("edges_invalidated_by_contradiction")
        elif record["side"] == "tkg":
            entities = graph.get("canonical_entities_rows", graph.get("canonical_entities"))
            facts, invalidated = record.get("triplets"), graph.get("invalidated_events", graph.get("event_invalidations_rows"))
        else:
            entities, facts, invalidated = None, record.get("events"), None
        lines.append(f"| {LABELS.get(record['config'], record['config'])} | {fmt(record['wall_s'], 1)} | "
                     f"{fmt(record['first_to_last_request_s'], 1)} | {fmt(record['requests'])} | {fmt(record['status_429'])} | "
                     f"{fmt(record['input_tokens'])} | {fmt(record['output_tokens'])} | "
                     + "".join(f"{fmt(record.get(bound), 1)} | {fmt(record.get(ratio), 2)} | " for bound, ratio in bound_keys)
                     + f"{fmt(record['mean_in_flight'], 1)} | "
                     f"{fmt(entities) if isinstance(entities, (int, float)) else 'n/a'} | "
                     f"{fmt(facts) if isinstance(facts, (int, float)) else 'n/a'} | "
                     f"{fmt(invalidated) if isinstance(invalidated, (int, float)) else 'n/a'} |")
    lines.append("")
    for record in results["runs"]:
        lines.append(f"- {LABELS.get(record['config'], record['config'])}: "
                     + ", ".join(f"{name} {row['requests']}" for name, row in record["by_schema"].items()))
    lines.append("")
    for name, ratio in results["ratios_to_tkg"].items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {v}x" for k, v in ratio.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_llm.add_provider_arguments(parser)
    parser.add_argument("--limit", type=int, default=4, help="number of the four 2017 AMD calls to use (every side)")
    parser.add_argument("--modes", type=lambda text: text.split(","), default=["one_by_one", "bulk"],
                        help="Graphiti modes, comma-separated: one_by_one, bulk")
    parser.add_argument("--no-baseline", action="store_true", help="skip the cookbook-style baseline")
    parser.add_argument("--graphiti-max-coroutines", type=int, default=None,
                        help="Graphiti's max_coroutines (its documented remedy for 429s; default: its SEMAPHORE_LIMIT, 20)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: results/graphiti_realistic.json (slots model: results/graphiti.json)")
    parser.add_argument("--keep-tmp", action="store_true")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = HERE / "results" / ("graphiti.json" if args.provider == "slots" else "graphiti_realistic.json")
    unknown = sorted(set(args.modes) - {"one_by_one", "bulk"})
    if unknown:
        parser.error(f"unknown Graphiti mode(s) {unknown}; use one_by_one, bulk or both, comma-separated")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not DATA.exists():
        print(f"SKIPPED: {DATA} not found (the real earnings-call corpus lives in ../shared; "
              "set TKG_EARNINGS_CALLS to its transcripts.parquet)")
        return 0
    try:
        import graphiti_core  # noqa: F401
        import kuzu  # noqa: F401
    except ImportError as exc:
        print(f"SKIPPED: {exc.name} is not installed; install the bench extra: pip install -e '.[bench]'")
        return 0
    # Graphiti warns for every dangling edge endpoint it materialises; the counts are in the results
    logging.getLogger("graphiti_core").setLevel(logging.ERROR)
    return bench_llm.run_and_report(SideBySide(args), args.out, markdown)


if __name__ == "__main__":
    sys.exit(main())
