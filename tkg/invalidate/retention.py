"""Retention: a relevance score per fact, and archiving the facts that fall below it.

The seeds' production appendix asks for relevance = recency x source trust x how often a fact
is restated, and a job that moves what scores too low, or is older than its source's
time-to-live, out of the way without deleting history. Here:

- recency halves every `half_life_days`, counted from the last call that stated the fact;
- trust depends on the statement's kind (a FACT the company reports counts more than an
  OPINION or a PREDICTION);
- each restatement (the same statement in another call) adds to the score, logarithmically;
- "now" is the latest call in the graph, so the scores are a function of the data, not of
  the day the build ran.

Archived facts leave the `facts` view (and every view built on it) for `facts_archive`; their
events, triplets and history stay. Archiving is off unless the settings turn it on; the scores
are computed and published either way.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import yaml

from tkg.core.paths import CONFIG_DIR

# Bump when the scoring changes (the settings file is part of the code version too).
RETENTION_VERSION = "fact-relevance-1"
DEFAULT_SETTINGS = CONFIG_DIR / "retention.yaml"


@dataclass(frozen=True)
class RetentionSettings:
    enabled: bool = False
    half_life_days: float = 730.0
    min_relevance: float = 0.05
    trust: dict[str, float] = field(default_factory=lambda: {"FACT": 1.0, "PREDICTION": 0.6, "OPINION": 0.4})
    ttl_days: dict[str, int | None] = field(default_factory=lambda: {"FACT": None, "PREDICTION": 1095, "OPINION": 730})

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def retention_settings(path: str | Path | None = None) -> RetentionSettings:
    """The settings in `path`, else TKG_RETENTION, else tkg/config/retention.yaml."""
    path = Path(path or os.environ.get("TKG_RETENTION") or DEFAULT_SETTINGS).expanduser()
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"retention settings {path} do not exist; set TKG_RETENTION to a retention.yaml") from None
    known = set(RetentionSettings.__dataclass_fields__)
    unknown = sorted(set(document) - known)
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known are {', '.join(sorted(known))}")
    defaults = RetentionSettings()
    return RetentionSettings(**{**asdict(defaults), **document,
                                "trust": {**defaults.trust, **(document.get("trust") or {})},
                                "ttl_days": {**defaults.ttl_days, **(document.get("ttl_days") or {})}})


def score_facts(connection: duckdb.DuckDBPyConnection, events: str, settings: RetentionSettings) -> duckdb.DuckDBPyRelation:
    """One row per event of the view `events` (event_id, statement_hash, statement_type,
    created_at): its relevance, restatements, last statement, and whether (and why) it is
    archived. A DuckDB relation: it runs out of core."""
    connection.register("retention_trust", pa.table({"statement_type": list(settings.trust),
                                                     "trust": list(settings.trust.values())}))
    connection.register("retention_ttl", pa.table({"statement_type": list(settings.ttl_days),
                                                   "ttl_days": pa.array(list(settings.ttl_days.values()), pa.int64())}))
    return connection.sql(
        f"""
        WITH latest AS (SELECT max(created_at) AS now FROM {events}),
        stated AS (
            SELECT statement_hash, count(*) AS restatements, max(created_at) AS last_stated_at
            FROM {events} GROUP BY statement_hash
        ), scored AS (
            SELECT e.event_id, s.restatements, s.last_stated_at,
                   date_diff('day', s.last_stated_at, (SELECT now FROM latest)) AS age_days,
                   date_diff('day', e.created_at, (SELECT now FROM latest)) AS own_age_days,
                   coalesce(t.trust, 0.5) AS trust, l.ttl_days
            FROM {events} e JOIN stated s USING (statement_hash)
            LEFT JOIN retention_trust t USING (statement_type) LEFT JOIN retention_ttl l USING (statement_type)
        )
        SELECT event_id,
               pow(0.5, age_days / $half_life) * trust * (1 + ln(restatements)) AS relevance,
               restatements, last_stated_at, age_days,
               CASE WHEN NOT $enabled THEN NULL
                    WHEN ttl_days IS NOT NULL AND own_age_days > ttl_days THEN 'older than its ' || ttl_days || '-day time-to-live'
                    WHEN pow(0.5, age_days / $half_life) * trust * (1 + ln(restatements)) < $min_relevance
                        THEN 'relevance below ' || $min_relevance
               END AS archive_reason
        FROM scored ORDER BY event_id
        """,
        params={"half_life": settings.half_life_days, "enabled": settings.enabled, "min_relevance": settings.min_relevance},
    )
