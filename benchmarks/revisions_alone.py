"""Benchmark: the figure revisions of a new quarter, against their last output or every figure.

`invalidated_events` revises guidance figures (tkg.invalidate.revisions). Since session 64 it
revises again only the guidance a changed figure may retire differently
(tkg.invalidate.revising.revise_since), against its last output. This times that, side by
side in one process, against revising every figure company by company (what the step did
before), on a store `bench_scale.py --keep` left:

1. the store's figures without the newest quarter's partitions of `--companies` companies (the
   issue's quarter, as `bench_scale.py --increment-companies` holds it back) are revised from
   nothing: the last output;
2. each round revises every figure of the store twice, alternated: from nothing, company by
   company (the whole), and against that last output (`revise_since`). Each time the outputs
   (figure invalidations, judgments, retired events) must be equal.

    python benchmarks/revisions_alone.py --store STORE [--companies 400] [--rounds 3] [--out FILE]

It reads the store and writes nothing in it. DuckDB runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402  (the benchmarks folder is not a package)

from tkg.core import tables  # noqa: E402
from tkg.invalidate.revising import revise_since  # noqa: E402
from tkg.invalidate.revisions import READ_COLUMNS, READ_SCHEMA, company_slices, revise_figures  # noqa: E402
from tkg.store.packs import packed  # noqa: E402
from tkg.store.parquet import ParquetStore  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _connection() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={"threads": 1})


def whole(store: ParquetStore, files: list) -> tuple[pa.Table, pa.Table, dict]:
    """Every figure revised, a company at a time (the step before session 64)."""
    connection = _connection()
    figures = packed(store, connection, files).select(*READ_COLUMNS).order("company").to_arrow_table().cast(READ_SCHEMA)
    invalidations, judgments, retired = [], [], {}
    for company in company_slices(figures):
        part = revise_figures(company)
        invalidations.append(part.figure_invalidations)
        judgments.extend(part.judgments)
        retired.update(part.retired_events)
    judgments.sort(key=lambda r: (r["primary_event_id"], r["secondary_event_id"], r["reason"]))
    return (pa.concat_tables(invalidations).sort_by("figure_id"), tables.to_table(judgments, tables.INVALIDATION_JUDGMENTS),
            retired)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--companies", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "revisions_alone.json")
    args = parser.parse_args()
    store = ParquetStore(args.store)
    quarter = bench_scale._newest_quarter(args.store)
    chosen = bench_scale.reporting_companies(args.store, quarter, args.companies)
    files = store.partition_files("figures")
    held = {f for f in files if f.parent.name == quarter and (chosen is None or f.parent.parent.name in chosen)}
    connection = _connection()
    start = _cpu()
    last = revise_since(connection, packed(store, connection, [f for f in files if f not in held]).select(*READ_COLUMNS), None)
    report = {"store": str(args.store), "quarter": quarter.removeprefix("quarter="), "partitions_added": len(held),
              "figures": packed(store, connection, files).aggregate("count(*)").fetchall()[0][0],
              "last_output_cpu_s": round(_cpu() - start, 2), "whole_cpu_s": [], "since_cpu_s": []}
    with tempfile.TemporaryDirectory() as folder:
        kept = Path(folder)
        pq.write_table(last.figure_invalidations, kept / "figure_invalidations.parquet")
        pq.write_table(last.memo, kept / "revision_figures.parquet")
        for n in range(args.rounds):
            start = _cpu()
            invalidations, judgments, retired = whole(store, files)
            report["whole_cpu_s"].append(round(_cpu() - start, 2))
            connection = _connection()
            start = _cpu()
            now = revise_since(connection, packed(store, connection, files).select(*READ_COLUMNS),
                               (connection.read_parquet(str(kept / "figure_invalidations.parquet")),
                                connection.read_parquet(str(kept / "revision_figures.parquet"))))
            report["since_cpu_s"].append(round(_cpu() - start, 2))
            equal = (now.figure_invalidations.equals(invalidations), now.judgments.equals(judgments), now.retired_events == retired)
            if not all(equal):
                raise SystemExit(f"round {n}: the outputs differ (invalidations, judgments, retired events): {equal}")
            report.update(guidance_revised_again=now.revised_again, figure_invalidations=invalidations.num_rows,
                          events_retired=len(retired))
            print(f"round {n}: whole {report['whole_cpu_s'][-1]} CPU-s, since {report['since_cpu_s'][-1]} CPU-s, "
                  "outputs equal", flush=True)
    report["median_whole_cpu_s"] = statistics.median(report["whole_cpu_s"])
    report["median_since_cpu_s"] = statistics.median(report["since_cpu_s"])
    report["tkg_revision"] = bench_scale.tkg_revision()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({key: value for key, value in report.items() if key != "tkg_revision"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
