"""The stage catalog: one row per stage of the pipeline, in the order they run.

A row says what a stage reads (other stages, and outside inputs such as the source rows), what
it writes (its tables and their schemas), the function that computes it, what its code version
hashes, the prompt it sends and the LLM usage counters it is accounted under, its Dagster group,
and whether it is partitioned (company x quarter) or global (over all partitions).

Everything that lists stages is derived from here: the store's state and stamps
(tkg.build.state), the planner, the worker pool, the warehouse's raw tables, the CLI's
listings and the Dagster assets and their lineage. Adding a stage is a row here, its function
(`StageJob -> StageResult`, tkg.core.results) and its SQL or prompt files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from tkg.core import tables
from tkg.core.ids import short_version
from tkg.core.results import StageJob, StageResult
from tkg.extract import stages as extract
from tkg.extract.stages import ENTITIES_VERSION
from tkg.ingest import stages as ingest
from tkg.ingest.stages import CHUNKS_VERSION, TRANSCRIPTS_VERSION
from tkg.invalidate import stages as invalidate
from tkg.invalidate.retention import RETENTION_VERSION, retention_settings
from tkg.llm.prompts import TEMPLATES
from tkg.providers import Fingerprints
from tkg.resolve import stages as resolve
from tkg.resolve.resolution import RESOLUTION_VERSION
from tkg.store.warehouse import RawTable, warehouse_code_version


@dataclass(frozen=True)
class Table:
    """A table a stage writes: its name in tkg.duckdb's `raw` schema and its columns."""

    name: str
    schema: pa.Schema


@dataclass(frozen=True)
class Stage:
    name: str  # the asset's name, and the folder of its Parquet files
    group: str  # the Dagster asset group: its phase
    description: str  # what it holds (the asset's description in the UI)
    code_version: Callable[[Fingerprints], str]  # what, besides its inputs, shapes its output
    compute: Callable[[StageJob], StageResult] | None = None  # None: the publish step (tkg.store.warehouse)
    inputs: tuple[str, ...] = ()  # the stages it reads (of its own partition, or every partition for a global stage)
    outside_inputs: tuple[str, ...] = ()  # what else it reads, by name (tkg.build.state.OUTSIDE_INPUTS)
    tables: tuple[Table, ...] = ()  # what it writes; a global stage's last table carries its stamp
    partitioned: bool = True
    prompt: str | None = None  # its prompt template (prompts/), on the LLM path
    counters: tuple[str, ...] = ()  # the usage counters its requests are accounted under
    calls_provider: bool = False  # it waits on the LLM provider (the Dagster pool of such steps)

    @property
    def table(self) -> Table:
        """The table that carries the stage's stamp: a partitioned stage's one table, or the
        table a global stage writes last."""
        return self.tables[-1]


STAGES: tuple[Stage, ...] = (
    Stage(
        "transcripts", "ingestion",
        "Earnings calls of one company in one calendar quarter, parsed from StreetEvents text: title and fiscal "
        "quarter (with the period it covers), call time, participants with their organisations and titles, sections "
        "and speaker turns. Definitions/Disclaimer boilerplate is dropped. A call that no longer parses fails the run "
        "and keeps the partition's last good output; so does a source row that cannot be read once the partition is "
        "built.",
        code_version=lambda f: TRANSCRIPTS_VERSION, compute=ingest.parse_transcripts,
        outside_inputs=("source", "company"), tables=(Table("transcripts", tables.TRANSCRIPTS),)),
    Stage(
        "chunks", "ingestion",
        "Semantic chunks (chonkie SemanticChunker over sentence embeddings) of each speaker turn, plus one chunk for "
        "the participants list. Each chunk keeps its speaker and its character offsets into the transcript.",
        code_version=lambda f: short_version(CHUNKS_VERSION, repr(f.chunking), f.chunk_embedder),
        compute=ingest.chunk_transcripts, inputs=("transcripts",), tables=(Table("chunks", tables.CHUNKS),)),
    Stage(
        "statements", "extraction",
        "Atomic statements extracted from each chunk, typed FACT/OPINION/PREDICTION and STATIC/DYNAMIC/ATEMPORAL, "
        "with pronouns and 'we' resolved to the company.",
        code_version=lambda f: f.extractor("statements"), compute=extract.extract_statements,
        inputs=("transcripts", "chunks"), tables=(Table("statements", tables.STATEMENTS),),
        prompt=TEMPLATES["statements"], counters=("statements",), calls_provider=True),
    Stage(
        "temporal_events", "extraction",
        "One temporal event per statement: validity range (valid_at/invalid_at, resolved against the call date and "
        "the company's fiscal calendar), statement embedding, and created_at, the time the call was published.",
        code_version=lambda f: short_version(f.extractor("validity"), f.embedder), compute=extract.build_events,
        inputs=("transcripts", "statements"), tables=(Table("events", tables.EVENTS),),
        prompt=TEMPLATES["validity"], counters=("validity", "embeddings"), calls_provider=True),
    Stage(
        "triplets", "extraction",
        "Subject-predicate-object triplets over the 20-predicate vocabulary, with their entities, for every statement "
        "(its event). A triplet pointing at no extracted entity is dropped and counted. It needs only the statements, "
        "so it runs in parallel with temporal_events.",
        code_version=lambda f: f.extractor("triplets"), compute=extract.extract_triplets,
        inputs=("transcripts", "statements"), tables=(Table("triplets", tables.TRIPLETS),),
        prompt=TEMPLATES["triplets"], counters=("triplets",), calls_provider=True),
    Stage(
        "figures", "extraction",
        "Financial figures the company's people stated: reported results and guidance, with metric, segment, basis, "
        "fiscal period and value in base units (the rows of the `metrics` view). Run rates, FX headwinds, backlog, "
        "comparisons and long-term targets are left out.",
        code_version=lambda f: f.extractor("figures"), compute=extract.extract_figures,
        inputs=("transcripts", "chunks", "statements"), tables=(Table("figures", tables.FIGURES),),
        prompt=TEMPLATES["figures"], counters=("figures",), calls_provider=True),
    Stage(
        "entities", "extraction",
        "Entity mentions (every subject and object of a triplet) with type, description and a description "
        "embedding, ready for entity resolution.",
        code_version=lambda f: short_version(ENTITIES_VERSION, f.embedder), compute=extract.build_entity_mentions,
        inputs=("triplets",), tables=(Table("entities", tables.ENTITIES),), counters=("embeddings",),
        calls_provider=True),
    Stage(
        "canonical_entities", "resolution",
        "Every entity mention of every partition mapped to a canonical entity. People match on parsed names "
        "(nicknames, initials), companies on suffix-free names and the company registry, offices on (role, "
        "organisation). Entities are a function of the mentions, not of build history; ids an earlier build issued "
        "stay, with `merged_into`. Refuses to run while any partition is half-built.",
        code_version=lambda f: RESOLUTION_VERSION, compute=resolve.canonical_entities, inputs=("entities",),
        outside_inputs=("registry",), partitioned=False,
        tables=(Table("entity_resolution", tables.ENTITY_RESOLUTION), Table("canonical_entities", tables.CANONICAL_ENTITIES))),
    Stage(
        "invalidated_events", "resolution",
        "The bi-temporal history: which DYNAMIC facts a later fact retired, when (invalid_at), when that became known "
        "(expired_at) and by which event (invalidated_by), and which guidance figures a later call revised. Recomputed "
        "from all events, so the result never depends on the order partitions arrived in. Every judgment and its "
        "reason is kept for audit.",
        code_version=lambda f: f.judge, compute=invalidate.invalidated_events,
        inputs=("temporal_events", "triplets", "figures", "canonical_entities"), partitioned=False,
        tables=(Table("invalidation_judgments", tables.INVALIDATION_JUDGMENTS),
                Table("figure_invalidations", tables.FIGURE_INVALIDATIONS),
                Table("event_invalidations", tables.EVENT_INVALIDATIONS)),
        prompt=TEMPLATES["judge"], counters=("judge",)),
    Stage(
        "fact_relevance", "retention",
        "A relevance score per fact: recency (halving every half_life_days from its last statement) x trust in its "
        "kind (FACT, PREDICTION, OPINION) x (1 + ln restatements). With archiving turned on (TKG_RETENTION, "
        "tkg/config/retention.yaml; off by default), facts below the threshold or past their kind's time-to-live move "
        "from the `facts` view to `facts_archive`; nothing is deleted.",
        code_version=lambda f: f"{RETENTION_VERSION}:{retention_settings().fingerprint()}",
        compute=invalidate.fact_relevance, inputs=("temporal_events",), partitioned=False,
        tables=(Table("fact_relevance", tables.FACT_RELEVANCE),)),
)
WAREHOUSE = Stage(
    "warehouse", "warehouse",
    "Publishes tkg.duckdb: a fresh file holding the Parquet tables (schema `raw`) and every SQL model, swapped into "
    "place atomically, so readers never block the pipeline and always see a consistent snapshot. Query it with "
    "`duckdb -readonly` or `tkg sql`. The checks run on the new file before the swap: if a blocking one fails, the "
    "new file is discarded and the last good one stays.",
    code_version=lambda f: warehouse_code_version(), inputs=tuple(stage.name for stage in STAGES), partitioned=False)
# The LLM accounting every step writes beside its output (tkg.build.stages.record_usage).
USAGE_TABLE = RawTable("llm_calls", "llm_calls", tables.LLM_CALLS, pattern="llm_calls/**/llm_calls.parquet")

BY_NAME: dict[str, Stage] = {stage.name: stage for stage in (*STAGES, WAREHOUSE)}
PARTITIONED: tuple[Stage, ...] = tuple(stage for stage in STAGES if stage.partitioned)
GLOBAL: tuple[Stage, ...] = tuple(stage for stage in STAGES if not stage.partitioned)  # before the publish step
PARTITIONED_NAMES: tuple[str, ...] = tuple(stage.name for stage in PARTITIONED)


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(BY_NAME)}") from None


def downstream_of(names: set[str]) -> set[str]:
    """`names` and every partitioned stage that reads one of them, directly or not."""
    closed = set(names)
    for row in PARTITIONED:
        if any(upstream in closed for upstream in row.inputs):
            closed.add(row.name)
    return closed


def code_versions(fingerprints: Fingerprints) -> dict[str, str]:
    """The code version of every stage (a hash of its prompt template, model and settings, or of
    its rule set): a new prompt or model marks the asset stale in the UI and makes `tkg build`
    rebuild what it shapes."""
    return {row.name: row.code_version(fingerprints) for row in (*STAGES, WAREHOUSE)}


def raw_tables() -> list[RawTable]:
    """The tables of the published file's `raw` schema: every stage's tables and the usage."""
    found = [RawTable(table.name, row.name, table.schema, None if row.partitioned else table.name)
             for row in STAGES for table in row.tables]
    return [*found, USAGE_TABLE]
