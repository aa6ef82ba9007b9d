-- description: Reported and guided financial figures, one row per figure per call, with their revision history: company, metric (revenue, segment_revenue, gross_margin, operating_margin, operating_income, operating_expenses, net_income, eps, capex, free_cash_flow, revenue_growth), segment, basis (GAAP, non-GAAP or NULL), kind (reported or guidance), the company's fiscal_year and fiscal_quarter (NULL: full year), value/low/high in base units, unit (USD or the stated currency, percent, USD/share), the evidence (statement, event_id, call_date) and validity: valid_at is the call that stated it, invalid_at and invalidated_by the later call and statement that revised the guidance, reported its actual or closed its period; restatements and last_stated_on: guidance restated with the same value at later calls is one row.
-- depends_on: events
-- upstream_assets: figures, invalidated_events
CREATE OR REPLACE VIEW metrics AS
WITH per_call AS (
    SELECT f.company, f.metric, f.segment, f.basis, f.kind, f.fiscal_year, f.fiscal_quarter,
           f.value, f.low, f.high, f.unit,
           e.statement, f.event_id, f.call_date,
           f.stated_at AS valid_at, i.invalid_at, i.invalidated_by,
           i.expired_at, i.reason AS revision, i.invalidated_by_figure, f.amount_text, f.figure_id
    FROM raw.figures AS f
    JOIN events AS e ON e.event_id = f.event_id
    LEFT JOIN raw.figure_invalidations AS i ON i.figure_id = f.figure_id
    -- The same figure stated twice in one call (a sentence and its restatement) is one row; the
    -- fullest sentence is its evidence.
    QUALIFY row_number() OVER (
        PARTITION BY f.company, f.call_date, f.metric, f.segment, f.basis, f.kind, f.fiscal_year, f.fiscal_quarter,
                     f.value, f.low, f.high, f.unit
        ORDER BY length(e.statement) DESC, f.figure_id) = 1
)
-- Guidance restated at later calls with the same value is one row that stood from the first call
-- to the revision that retired them all (they share invalid_at): `restatements` counts the
-- calls, `last_stated_on` is the last. A reported figure stays one row per call.
SELECT * EXCLUDE (nth) FROM (
    SELECT *,
           count(*) OVER chain AS restatements,
           max(call_date) OVER chain AS last_stated_on,
           row_number() OVER (PARTITION BY company, metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, low, high,
                                           unit, invalid_at, CASE WHEN kind = 'guidance' THEN NULL ELSE call_date END
                              ORDER BY call_date, figure_id) AS nth
    FROM per_call
    WINDOW chain AS (PARTITION BY company, metric, segment, basis, kind, fiscal_year, fiscal_quarter, value, low, high, unit,
                                  invalid_at, CASE WHEN kind = 'guidance' THEN NULL ELSE call_date END)
)
WHERE nth = 1;
