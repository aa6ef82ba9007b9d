"""How trustworthy `metrics` is on a built tkg.duckdb, by the two numbers of issue 25.

    python benchmarks/metrics_quality.py --home DIR [--conflicts N] [--sample N --seed S] [--out FILE.json]

- conflict rate: reported keys (company, metric, segment, basis, fiscal_year, fiscal_quarter,
  call_date) with two or more distinct (value, low, high), over all reported keys; a key with
  two values is a misfiled figure;
- open guidance: guidance rows for a (company, fiscal_year, fiscal_quarter) that has a reported
  row, with `invalid_at` null, over all such guidance rows.

`--conflicts N` prints N conflicting keys with each value's statement, `--sample N` a seeded
random sample of N rows beside their statements, for reading by hand; `--out` writes the two
numbers (and the load average) to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import duckdb

KEY = "company, metric, segment, basis, fiscal_year, fiscal_quarter, call_date"
CONFLICTS_SQL = (f"WITH k AS (SELECT count(DISTINCT (value, low, high)) AS n FROM metrics WHERE kind = 'reported' GROUP BY {KEY}) "
                 "SELECT count(*) FILTER (WHERE n >= 2), count(*) FROM k")
OPEN_GUIDANCE_SQL = (
    "SELECT count(*) FILTER (WHERE g.invalid_at IS NULL), count(*) FROM metrics AS g WHERE g.kind = 'guidance' AND EXISTS ("
    "SELECT 1 FROM metrics AS r WHERE r.kind = 'reported' AND r.company = g.company AND r.fiscal_year = g.fiscal_year "
    "AND r.fiscal_quarter IS NOT DISTINCT FROM g.fiscal_quarter)")


def conflict_rate(connection: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(reported keys with two or more values, reported keys)."""
    return connection.execute(CONFLICTS_SQL).fetchone()


def open_guidance(connection: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(guidance rows still open whose period has reported results, such guidance rows)."""
    return connection.execute(OPEN_GUIDANCE_SQL).fetchone()


def _row(row: tuple) -> str:
    company, metric, segment, basis, kind, year, quarter, value, low, high, unit, day, statement = row
    period = f"Q{quarter} {year}" if quarter else f"FY{year}"
    span = f" [{low:g}..{high:g}]" if low is not None else ""
    return (f"{company} {day} {kind} {metric} seg={segment} basis={basis} {period} = {value:g}{span} {unit}\n"
            f"    {' '.join(statement.split())[:400]}")


ROW = "company, metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, low, high, unit, call_date, statement"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a data folder holding tkg.duckdb")
    parser.add_argument("--conflicts", type=int, default=0, help="print this many conflicting keys with their statements")
    parser.add_argument("--sample", type=int, default=0, help="print this many random metrics rows with their statements")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--out", type=Path, help="write the numbers to this JSON file")
    options = parser.parse_args()
    database = options.home / "tkg.duckdb"
    if not database.exists():
        print(f"no tkg.duckdb in {options.home}; build it first with `tkg build --home {options.home}`", file=sys.stderr)
        return 1
    connection = duckdb.connect(str(database), read_only=True)
    conflicts, keys = conflict_rate(connection)
    open_rows, closed = open_guidance(connection)
    rows = connection.execute("SELECT count(*) FROM metrics").fetchone()[0]
    print(f"metrics rows: {rows}")
    print(f"conflict rate: {conflicts}/{keys} = {conflicts / max(keys, 1):.1%}")
    print(f"open guidance: {open_rows}/{closed} = {open_rows / max(closed, 1):.1%}")
    if options.out:
        options.out.write_text(json.dumps({"home": str(options.home), "metrics_rows": rows, "conflicting_keys": conflicts,
                                           "reported_keys": keys, "open_guidance": open_rows, "guidance_with_results": closed,
                                           "load_average": os.getloadavg()}, indent=2) + "\n")
    if options.conflicts:
        conflicting = connection.execute(
            f"SELECT {KEY} FROM metrics WHERE kind = 'reported' GROUP BY {KEY} HAVING count(DISTINCT (value, low, high)) >= 2 "
            f"ORDER BY {KEY}").fetchall()
        random.Random(options.seed).shuffle(conflicting)
        for key in conflicting[:options.conflicts]:
            print("--")
            for row in connection.execute(
                    f"SELECT {ROW} FROM metrics WHERE kind = 'reported' AND company = ? AND metric = ? AND segment IS NOT DISTINCT FROM ? "
                    "AND basis IS NOT DISTINCT FROM ? AND fiscal_year = ? AND fiscal_quarter IS NOT DISTINCT FROM ? AND call_date = ? "
                    "ORDER BY value", list(key)).fetchall():
                print(_row(row))
    if options.sample:
        ids = [row[0] for row in connection.execute("SELECT figure_id FROM metrics ORDER BY figure_id").fetchall()]
        chosen = random.Random(options.seed).sample(ids, min(options.sample, len(ids)))
        for number, figure_id in enumerate(chosen, 1):
            row = connection.execute(f"SELECT {ROW} FROM metrics WHERE figure_id = ?", [figure_id]).fetchone()
            print(f"#{number} {_row(row)}")
    connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
