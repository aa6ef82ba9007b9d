"""Query latency on a published full-corpus graph: `facts_as_of`, the query layer and `tkg ask`.

    python benchmarks/bench_query.py --home DIR     # DIR holds a tkg.duckdb built from the corpus
    python benchmarks/bench_query.py                # builds the corpus first into a temporary folder

`facts_as_of` is timed side by side with the view it replaced: the same macro over `facts` as
a view joining `triplets`, `events` and `transcripts` on every call (the published tables are
attached read-only into an in-memory database that holds that view). Each figure is a median
(and 95th percentile) over the same dates, one query after the other, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = Path(os.environ.get("TKG_SHARED", ROOT.parent / "shared")) / "data" / "earnings_calls" / "transcripts.parquet"

AS_OF = "SELECT * FROM facts_as_of(?::TIMESTAMP) WHERE company = ?"
# The same query without turning rows into Python objects: the database's share of the time.
AS_OF_COUNT = "SELECT count(*) FROM facts_as_of(?::TIMESTAMP) WHERE company = ?"
# The facts view as published before it became a table (the joins ran on every query).
FACTS_AS_VIEW = """
CREATE VIEW facts AS
SELECT e.company, tr.fiscal_quarter, tr.call_date, t.subject, t.subject_id, t.predicate, t.object, t.object_id, t.value,
       e.statement, e.statement_type, e.temporal_type, e.valid_at, e.invalid_at, e.created_at, e.expired_at,
       e.invalidated_by, e.asserted_invalid_at, e.chunk_id, e.event_id, t.triplet_id, e.transcript_id, r.relevance
FROM g.main.triplets AS t
JOIN g.main.events AS e ON e.event_id = t.event_id
JOIN g.main.transcripts AS tr ON tr.transcript_id = e.transcript_id
LEFT JOIN g.raw.fact_relevance AS r ON r.event_id = e.event_id
WHERE r.archive_reason IS NULL
"""


def timed(function, inputs: list) -> dict[str, float]:
    """Milliseconds per call of `function` over `inputs`, one after the other."""
    samples = []
    for item in inputs:
        started = time.perf_counter()
        function(item)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 2), "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 2),
            "n": len(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, help="a data folder with a full-corpus tkg.duckdb (default: build one)")
    parser.add_argument("--queries", type=int, default=200, help="as-of queries per side (default 200)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "query.json")
    args = parser.parse_args()
    home = args.home
    if home is None:
        if not CORPUS.exists():
            print(f"SKIPPED: the real corpus is not at {CORPUS}")
            return
        home = Path(tempfile.mkdtemp(prefix="tkg-bench-query-"))
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TKG_LLM")}
        subprocess.run([sys.executable, "-m", "tkg.cli", "build", "--source", str(CORPUS)], check=True,
                       env={**env, "TKG_HOME": str(home)}, cwd=ROOT, capture_output=True)
    path = home / "tkg.duckdb"

    from tkg.answer.ask import answer_offline
    from tkg.answer.query import Graph
    from tkg.store.warehouse import model

    randomness = random.Random(7)
    with duckdb.connect(str(path), read_only=True) as connection:
        companies = [row[0] for row in connection.execute("SELECT DISTINCT company FROM facts ORDER BY 1").fetchall()]
    cases = [(date(2016, 1, 1) + timedelta(days=randomness.randrange(5 * 365)), randomness.choice(companies))
             for _ in range(args.queries)]
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "duckdb": duckdb.__version__},
                     "graph": str(path), "load_average_before": os.getloadavg()}

    table = duckdb.connect(str(path), read_only=True)
    rows = table.execute("SELECT count(*) FROM facts").fetchone()[0]
    view = duckdb.connect()
    view.execute(f"ATTACH '{path}' AS g (READ_ONLY)")
    view.execute(FACTS_AS_VIEW)
    view.execute(model("facts_as_of").sql)  # the published macro, over the view

    def as_of(connection: duckdb.DuckDBPyConnection, sql: str = AS_OF):
        return lambda case: connection.execute(sql, [str(case[0]), case[1]]).fetchall()

    for connection in (table, view):  # warm both: the first query of a connection loads the tables
        as_of(connection)(cases[0])
    same = all(sorted(map(repr, as_of(table)(case))) == sorted(map(repr, as_of(view)(case))) for case in cases[:20])
    measured = {"table": timed(as_of(table), cases), "view (before)": timed(as_of(view), cases),
                "table, count only": timed(as_of(table, AS_OF_COUNT), cases),
                "view (before), count only": timed(as_of(view, AS_OF_COUNT), cases)}
    results["facts_as_of"] = {"facts": rows, "same_rows_as_the_view": same, **measured,
                              "view_over_table_p50": round(measured["view (before)"]["p50_ms"] / measured["table"]["p50_ms"], 1)}
    table.close()
    view.close()  # DuckDB opens a file once per process: the query layer's connection comes next

    with Graph.open(path) as graph:
        graph.search("warm up the embedder", k=1)
        people = ["Intel", "AMD", "Bob Swan", "Lisa Su", "Colette Kress", "Satya Nadella", "Luca Maestri", "Micron"] * 5
        results["find_entity"] = timed(graph.entity, people)
        results["factual_qa"] = timed(lambda name: graph.factual_qa(name, "2017-01-01", "2017-12-31"), people)
        results["search_k10"] = timed(lambda text: graph.search(text, k=10, company="INTC"), ["data center revenue growth"] * 20)
        questions = ["Who was Intel's CFO in June 2017?", "Who was AMD's CEO in June 2018?",
                     "Who was NVIDIA's CFO in June 2017?", "What revenue did Intel report for the second quarter of 2016?"] * 5
        results["ask_offline"] = timed(lambda question: answer_offline(graph, question), questions)
    results["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
