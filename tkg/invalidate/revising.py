"""Figure revisions against their last output: a new quarter revises the guidance it can change.

The rules are tkg.invalidate.revisions'. A guidance figure's retirement is decided by the
figures stated after it: those of its key (`_retirer`, which wins whenever it finds one), and
else its company's later calls and reported figures of its period (`_closer`). So a changed
figure (new, gone, or read differently, its company's fiscal year end included) can change
the retirement of a guidance figure of its company stated before it, and only when:

- it is of the guidance's key, and no later than the figure that revised the guidance (or the
  guidance was not revised: a later figure of its key wins over a closing);
- or the guidance was not revised, and it is no later than the call that closed the guidance
  (or the guidance was not closed).

Every other guidance figure keeps its retirement from the last output, which the memo
(tables.REVISION_FIGURES) holds with when it was settled. The ones that may change are revised
again from the figures that decide them alone: those of their keys, the reported figures of
their periods and the first figure of each of their companies' calls. The result is the same
as revising every figure, whatever the order partitions came in; with no last output every
guidance figure is revised. A change of the rules bumps the policy's `figure_judge`, part of
the step's code version: the last output is then not trusted, and every figure is revised.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from tkg.core import policy, tables
from tkg.invalidate.revisions import READ_COLUMNS, company_slices, revise_figures, year_end_month


@dataclass
class RevisedFigures:
    figure_invalidations: pa.Table
    judgments: pa.Table  # tables.INVALIDATION_JUDGMENTS, a row per figure invalidation
    retired_events: dict[str, tuple[datetime, str]]  # event -> (invalid_at, invalidated_by): every figure retired
    memo: pa.Table  # tables.REVISION_FIGURES
    revised_again: int  # the guidance figures revised in this run


# What the revisions read of each figure, hashed: a figure whose hash changed is a changed figure.
FIGURE_STATES_SQL = f"""
    CREATE OR REPLACE TEMP TABLE figure_states AS
    SELECT f.figure_id, f.event_id, f.company, f.kind, f.stated_at, f.fiscal_year, f.fiscal_quarter,
           hash({', '.join('f.' + name for name in policy.POLICY.guidance_key)}) AS key_hash,
           hash({', '.join('f.' + name for name in READ_COLUMNS)}, y.year_end_month) AS row_hash
    FROM revision_input f LEFT JOIN company_year_ends y USING (company)"""

# The guidance figures to revise again (see the module docstring): new or changed ones, and
# those a changed figure of their key or company may now retire differently.
DIRTY_GUIDANCE_SQL = """
    CREATE OR REPLACE TEMP TABLE dirty_guidance AS
    WITH now AS (SELECT figure_id, row_hash, company, key_hash, stated_at FROM figure_states),
    before AS (SELECT figure_id, row_hash, company, key_hash, stated_at FROM previous_figures),
    changed AS (SELECT * FROM (SELECT * FROM now EXCEPT SELECT * FROM before)
                UNION ALL SELECT * FROM (SELECT * FROM before EXCEPT SELECT * FROM now)),
    changed_keys AS (SELECT DISTINCT key_hash, stated_at FROM changed),
    changed_calls AS (SELECT DISTINCT company, stated_at FROM changed),
    guidance AS (SELECT g.figure_id, g.company, g.key_hash, g.stated_at, p.figure_id IS NULL AS new,
                        p.revised_at, p.closed_at
                 FROM figure_states g LEFT JOIN previous_figures p USING (figure_id, row_hash)
                 WHERE g.kind = 'guidance')
    SELECT figure_id FROM guidance WHERE new
    UNION SELECT g.figure_id FROM guidance g JOIN changed_keys c
        ON c.key_hash = g.key_hash AND c.stated_at > g.stated_at AND (g.revised_at IS NULL OR c.stated_at <= g.revised_at)
    UNION SELECT g.figure_id FROM guidance g JOIN changed_calls c
        ON c.company = g.company AND c.stated_at > g.stated_at AND g.revised_at IS NULL
           AND (g.closed_at IS NULL OR c.stated_at <= g.closed_at)"""

# The figures that decide the dirty guidance: those of their keys, the reported figures of their
# periods and the first figure (by figure_id) of each call of their companies.
DECIDING_FIGURES_SQL = f"""
    WITH dirty AS (SELECT * FROM figure_states SEMI JOIN dirty_guidance USING (figure_id)),
    deciding AS (
        SELECT figure_id FROM figure_states SEMI JOIN (SELECT DISTINCT key_hash FROM dirty) USING (key_hash)
        UNION SELECT f.figure_id FROM figure_states f
              SEMI JOIN (SELECT DISTINCT company, fiscal_year, fiscal_quarter FROM dirty) p  -- a year's period has no quarter
                  ON f.company = p.company AND f.fiscal_year IS NOT DISTINCT FROM p.fiscal_year
                     AND f.fiscal_quarter IS NOT DISTINCT FROM p.fiscal_quarter
              WHERE f.kind = 'reported'
        UNION SELECT min(figure_id) FROM figure_states SEMI JOIN (SELECT DISTINCT company FROM dirty) USING (company)
              GROUP BY company, stated_at)
    SELECT {', '.join(READ_COLUMNS)} FROM revision_input SEMI JOIN deciding USING (figure_id) ORDER BY company"""

# The last output's invalidations that stand: their figure read the same and not revised again.
KEPT_SQL = """
    SELECT i.*, p.closed_at IS NOT NULL AS closed
    FROM previous_invalidations i JOIN previous_figures p USING (figure_id)
    SEMI JOIN figure_states f USING (figure_id, row_hash)
    ANTI JOIN dirty_guidance d USING (figure_id)"""

JUDGMENTS_SQL = """
    SELECT f.event_id AS primary_event_id, i.invalidated_by AS secondary_event_id, true AS invalidates, i.reason,
           $judge AS judge, NULL AS cosine, NULL AS shared_entity_id, NULL AS predicate_group
    FROM figure_retirements i JOIN figure_states f USING (figure_id)
    ORDER BY primary_event_id, secondary_event_id, reason"""

# An event is retired when every figure it states is, at the latest of their retirements (the
# events with a retired figure only are looked at).
RETIRED_EVENTS_SQL = """
    SELECT f.event_id, max(i.invalid_at) AS invalid_at,
           arg_max(i.invalidated_by, (i.invalid_at, i.invalidated_by)) AS invalidated_by
    FROM figure_states f LEFT JOIN figure_retirements i USING (figure_id)
    WHERE f.event_id IN (SELECT event_id FROM figure_states SEMI JOIN figure_retirements USING (figure_id))
    GROUP BY f.event_id HAVING count(*) = count(i.figure_id)"""

MEMO_SQL = """
    SELECT f.figure_id, f.row_hash, f.company, f.key_hash, f.stated_at,
           CASE WHEN NOT i.closed THEN i.invalid_at END AS revised_at, CASE WHEN i.closed THEN i.invalid_at END AS closed_at
    FROM figure_states f LEFT JOIN figure_retirements i USING (figure_id) ORDER BY f.figure_id"""


def revise_since(connection: duckdb.DuckDBPyConnection, figures: duckdb.DuckDBPyRelation,
                 previous: tuple[duckdb.DuckDBPyRelation, duckdb.DuckDBPyRelation] | None) -> RevisedFigures:
    """Every figure's revision (`figures`: READ_COLUMNS of every figure) against the last
    output (`previous`: its figure invalidations and memo; None when there is none)."""
    figures.create_view("revision_input", replace=True)
    companies = [row[0] for row in connection.execute("SELECT DISTINCT company FROM revision_input").fetchall()]
    connection.register("company_year_ends", pa.table({
        "company": pa.array(companies, pa.string()),
        "year_end_month": pa.array([year_end_month(company) for company in companies], pa.int8())}))
    connection.execute(FIGURE_STATES_SQL)
    invalidations_before, memo_before = previous or (connection.from_arrow(tables.FIGURE_INVALIDATIONS.empty_table()),
                                                     connection.from_arrow(tables.REVISION_FIGURES.empty_table()))
    invalidations_before.create_view("previous_invalidations", replace=True)
    memo_before.create_view("previous_figures", replace=True)
    connection.execute(DIRTY_GUIDANCE_SQL)
    dirty = frozenset(row[0] for row in connection.execute("SELECT figure_id FROM dirty_guidance").fetchall())
    revised = _revise_by_company(connection.sql(DECIDING_FIGURES_SQL).to_arrow_table(), dirty)
    connection.register("revised_now", revised)
    connection.execute(f"CREATE OR REPLACE TEMP TABLE figure_retirements AS SELECT * FROM ({KEPT_SQL}) "
                       "UNION ALL SELECT * FROM revised_now")
    invalidations = connection.sql(f"SELECT {', '.join(tables.FIGURE_INVALIDATIONS.names)} FROM figure_retirements "
                                   "ORDER BY figure_id").to_arrow_table().cast(tables.FIGURE_INVALIDATIONS)
    judgments = connection.sql(JUDGMENTS_SQL, params={"judge": policy.POLICY.figure_judge}).to_arrow_table()
    retired = {event_id: (invalid_at, invalidated_by)
               for event_id, invalid_at, invalidated_by in connection.execute(RETIRED_EVENTS_SQL).fetchall()}
    return RevisedFigures(invalidations, judgments.cast(tables.INVALIDATION_JUDGMENTS), retired,
                          connection.sql(MEMO_SQL).to_arrow_table().cast(tables.REVISION_FIGURES), len(dirty))


def _revise_by_company(figures: pa.Table, only: frozenset[str]) -> pa.Table:
    """The invalidations of the guidance figures `only`, with whether each was closed, a company
    at a time (`figures` is ordered by company)."""
    parts = [tables.FIGURE_INVALIDATIONS.empty_table().append_column("closed", pa.array([], pa.bool_()))]
    for company in company_slices(figures):
        part = revise_figures(company, only)
        closed = [figure_id in part.closed for figure_id in part.figure_invalidations.column("figure_id").to_pylist()]
        parts.append(part.figure_invalidations.append_column("closed", pa.array(closed, pa.bool_())))
    return pa.concat_tables(parts)
