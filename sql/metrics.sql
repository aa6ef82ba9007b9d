-- description: Reported and guided financial figures, one row per figure per call, with their revision history: company, metric (revenue, segment_revenue, gross_margin, operating_margin, operating_income, operating_expenses, net_income, eps, capex, free_cash_flow, revenue_growth), segment, basis (GAAP, non-GAAP or NULL), kind (reported or guidance), the company's fiscal_year and fiscal_quarter (NULL: full year), value/low/high in base units, unit (USD or the stated currency, percent, USD/share), the evidence (statement, event_id, call_date) and validity: valid_at is the call that stated it, invalid_at and invalidated_by the later call and statement that revised the guidance or reported its actual.
-- depends_on: events
-- upstream_assets: figures, invalidated_events
CREATE OR REPLACE VIEW metrics AS
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
    ORDER BY length(e.statement) DESC, f.figure_id) = 1;
