"""The stage catalog: one row per stage of the pipeline, in the order they run.

A row says what a stage reads (other stages, and outside inputs such as the source rows), what
it writes (its tables and their schemas), the function that computes it, what its code version
hashes, the prompt it sends and the LLM usage counters it is accounted under, its Dagster group,
and its kind:
- `partition`: one run per company x quarter;
- `global`: one run over all partitions (it may also write tables split by shard, read by the
  sharded stages after it);
- `shard`: one run per shard, a stable hash bucket of the blocks the global half compares
  within; each shard's result is a function of its bucket's rows, and the global stages after
  it merge what crosses shards.

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
from tkg.invalidate import blocks
from tkg.invalidate import stages as invalidate
from tkg.invalidate.retention import RETENTION_VERSION, retention_settings
from tkg.invalidate.stages import INVALIDATION_VERSION, PAIRS_VERSION, POSITIONS_VERSION
from tkg.llm.prompts import TEMPLATES
from tkg.providers import Fingerprints
from tkg.resolve import stages as resolve
from tkg.resolve.resolution import RESOLUTION_VERSION
from tkg.resolve.stages import SPOKEN_VERSION
from tkg.store.warehouse import RawTable, warehouse_code_version


@dataclass(frozen=True)
class Table:
    """A table a stage writes: its name in tkg.duckdb's `raw` schema and its columns."""

    name: str
    schema: pa.Schema
    unpublished: tuple[str, ...] = ()  # columns kept in Parquet but not copied into tkg.duckdb
    key: tuple[str, ...] = ()  # a table split by shard: the columns that name a row within a shard
    # A memo (what its last output was made from, which the stage reads back; or its changes
    # since then, which the next step reads): a last output an older tkg wrote without it is
    # still trusted, and whoever reads it then does its work in full.
    memo: bool = False
    published: bool = True  # copied into tkg.duckdb's `raw` schema (when its stage is published)
    # The stage's table of this one's changes since its last version (tables.JUDGMENT_CHANGES):
    # a publish applies them to the rows it loaded rather than reloading the table.
    changes: str | None = None


@dataclass(frozen=True)
class Stage:
    name: str  # the asset's name, and the folder of its Parquet files
    group: str  # the Dagster asset group: its phase
    description: str  # what it holds (the asset's description in the UI)
    code_version: Callable[[Fingerprints], str]  # what, besides its inputs, shapes its output
    compute: Callable[[StageJob], StageResult] | None = None  # None: the publish step (tkg.store.warehouse)
    inputs: tuple[str, ...] = ()  # the stages it reads (of its own partition, or every partition for a global stage)
    outside_inputs: tuple[str, ...] = ()  # what else it reads, by name (tkg.build.state.OUTSIDE_INPUTS)
    tables: tuple[Table, ...] = ()  # what it writes; a global or shard stage's last table carries its stamp
    kind: str = "partition"  # partition | global | shard (see the module docstring)
    shard_tables: tuple[Table, ...] = ()  # a global stage's tables split by shard, for the shard stages after it
    published: bool = True  # its tables are copied into tkg.duckdb's `raw` schema
    prompt: str | None = None  # its prompt template (prompts/), on the LLM path
    counters: tuple[str, ...] = ()  # the usage counters its requests are accounted under
    calls_provider: bool = False  # it waits on the LLM provider (the Dagster pool of such steps)

    @property
    def partitioned(self) -> bool:
        return self.kind == "partition"

    @property
    def sharded(self) -> bool:
        return self.kind == "shard"

    @property
    def table(self) -> Table:
        """The table that carries the stage's stamp: a partitioned stage's one table, or the
        table a global or shard stage writes last."""
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
        inputs=("triplets",), tables=(Table("entities", tables.ENTITIES, unpublished=("embedding",)),), counters=("embeddings",),
        calls_provider=True),
    Stage(
        "canonical_entities", "resolution",
        "Every entity mention of every partition mapped to a canonical entity. People match on parsed names "
        "(nicknames, initials), companies on suffix-free names and the company registry, offices on (role, "
        "organisation). Entities are a function of the mentions, not of build history; ids an earlier build issued "
        "stay, with `merged_into`. Refuses to run while any partition is half-built.",
        code_version=lambda f: RESOLUTION_VERSION, compute=resolve.canonical_entities, inputs=("entities",),
        outside_inputs=("registry",), kind="global",
        tables=(Table("entity_resolution", tables.ENTITY_RESOLUTION),
                Table("group_evidence", tables.GROUP_EVIDENCE, memo=True, published=False),
                Table("name_groups", tables.NAME_GROUPS, memo=True, published=False),
                Table("mentions_read", tables.PARTITIONS_READ, memo=True, published=False),
                Table("canonical_entities", tables.CANONICAL_ENTITIES))),
    Stage(
        "spoken_mentions", "resolution",
        "Names as they are spoken in the call: the operator's introductions, self-introductions and 'in for' "
        "phrases, each linked to the participant it names (by speaker turn, else by the call's participants list "
        "and the nickname and initial rules) and so to that person's canonical entity; entity_aliases shows the "
        "new forms (source 'spoken').",
        code_version=lambda f: SPOKEN_VERSION, compute=resolve.spoken_mentions,
        inputs=("chunks", "statements", "triplets", "canonical_entities"), kind="global",
        tables=(Table("spoken_forms", tables.SPOKEN_FORMS, memo=True, published=False),
                Table("chunks_read", tables.PARTITIONS_READ, memo=True, published=False),
                Table("spoken_mentions", tables.SPOKEN_MENTIONS))),
    Stage(
        "fact_blocks", "invalidation",
        "The facts invalidation compares (FACT, non-ATEMPORAL events with triplets, each with the key of the fact it "
        "states) and the blocks they fall in: facts sharing a canonical entity under a predicate group. Written split "
        "into shards, a stable hash of the block, with each shard's facts, their vectors (rounded once, as the "
        "comparisons use them) and canonical triplets, so a shard's comparisons need nothing else. A run after the "
        "first reads only the facts whose rows may have changed (of a changed partition, with an entity that resolves "
        "differently, or in a block that one made or unmade) and writes the rows that did as a delta on the last version.",
        code_version=lambda f: f"{INVALIDATION_VERSION}:{f.shards}:{f.policy}:{blocks.sql_version()}", compute=blocks.fact_blocks,
        inputs=("temporal_events", "triplets", "canonical_entities"), kind="global", published=False,
        tables=(Table("fact_links", tables.FACT_LINKS, memo=True, published=False),
                Table("fact_entities", tables.FACT_ENTITIES, memo=True, published=False),
                Table("fact_partitions", tables.FACT_PARTITIONS, memo=True, published=False),
                Table("fact_blocks", tables.SHARD_SUMMARY)),
        shard_tables=(Table("facts", tables.FACTS, key=("event_id",)),
                      Table("members", tables.BLOCK_MEMBERS, key=("canonical_id", "predicate_group", "event_id")),
                      Table("triplets", tables.RESOLVED_TRIPLETS, key=("event_id", "triplet_id")))),
    Stage(
        "candidate_ranks", "invalidation",
        "One shard's blocks swept in time: for each incoming fact, its best candidate facts per type (cosine, time "
        "overlap, a shared entity), cut to the top k in each block; a block whose members did not change keeps its ranks, "
        "and one that only gained members ranks only the pairs with a new one. It names the incoming facts whose ranks "
        "changed since its last output (rank_changes), so the selection redoes only theirs. The ranks are stored as a "
        "base and the changes since it (a quarter writes the incoming facts whose ranks it changed, not every rank).",
        code_version=lambda f: f"{INVALIDATION_VERSION}:{f.policy}", compute=invalidate.candidate_ranks,
        inputs=("fact_blocks",), kind="shard", published=False,
        tables=(Table("ranked_members", tables.RANKED_MEMBERS), Table("rank_changes", tables.RANK_CHANGES),
                Table("rank_base", tables.SHARD_BASE, memo=True), Table("candidate_ranks", tables.CANDIDATE_RANKS))),
    Stage(
        "candidate_selection", "invalidation",
        "Every shard's ranks merged: each incoming fact's top k candidate facts over all its blocks, each sent to the "
        "shard of the smallest block that holds both, which pairs them. Only the incoming facts whose ranks changed in "
        "some shard since the last selection are selected again; written as a delta on the last version when few rows "
        "changed.",
        code_version=lambda f: f"{INVALIDATION_VERSION}:{f.policy}:{f.shards}", compute=invalidate.candidate_selection,
        inputs=("candidate_ranks",), kind="global", published=False,
        tables=(Table("ranks_read", tables.SHARDS_READ), Table("candidate_selection", tables.SHARD_SUMMARY)),
        shard_tables=(Table("selected", tables.CANDIDATE_RANKS, key=("incoming_event_id", "candidate_dynamic", "fact_key")),)),
    Stage(
        "judged_pairs", "invalidation",
        "One shard's judge pairs (the older event and the earliest restatement of a candidate fact that may retire it) "
        "and the judge's verdict on each, with its reason; each primary's earliest retirer in the shard. Against the "
        "shard's last output, only the facts whose selected rows or events changed are paired again, and a pair whose "
        "events did not change keeps its verdict from it. The judgments are stored as a base and the changes since it "
        "(a quarter writes the pairs it judged or dropped, not every judgment).",
        code_version=lambda f: f"{f.judge}:{PAIRS_VERSION}", compute=invalidate.judged_pairs,
        inputs=("fact_blocks", "candidate_selection"), kind="shard", published=False, prompt=TEMPLATES["judge"],
        counters=("judge",),
        tables=(Table("judgments", tables.SHARD_JUDGMENT_DELTA), Table("judgment_base", tables.SHARD_BASE),
                Table("paired_events", tables.PAIRED_EVENTS, memo=True),
                Table("paired_units", tables.PAIRED_UNITS, memo=True), Table("versions_read", tables.SPLITS_READ, memo=True),
                Table("judgment_changes", tables.JUDGMENT_CHANGES, memo=True), Table("retirements", tables.RETIREMENTS))),
    Stage(
        "invalidated_events", "invalidation",
        "The bi-temporal history: which DYNAMIC facts a later fact retired, when (invalid_at), when that became known "
        "(expired_at) and by which event (invalidated_by), and which guidance figures a later call revised. The "
        "earliest retirement over every shard wins, so the result depends on the set of events only, never on the "
        "order partitions arrived in or on the number of shards. Only the guidance figures a changed figure may retire "
        "differently are revised again; the others keep their retirement from the last output. Every judgment and its "
        "reason is kept for audit. "
        "The participants lists end positions too (one firm at a time, a later title replaces the earlier one, "
        "single-holder offices, and absence for the call's host, labelled end_evidence 'absence').",
        code_version=lambda f: f"{f.judge}:{POSITIONS_VERSION}:{f.policy}", compute=invalidate.invalidated_events,
        inputs=("judged_pairs", "figures", "temporal_events", "chunks", "triplets", "canonical_entities"), kind="global",
        tables=(Table("invalidation_judgments", tables.INVALIDATION_JUDGMENTS, changes="judgment_changes"),
                Table("judgment_changes", tables.JUDGMENT_CHANGES, memo=True, published=False),
                Table("judgments_read", tables.JUDGMENTS_READ, memo=True, published=False),
                Table("revision_judgments", tables.INVALIDATION_JUDGMENTS, memo=True, published=False),
                Table("revision_figures", tables.REVISION_FIGURES, memo=True, published=False),
                Table("figure_invalidations", tables.FIGURE_INVALIDATIONS),
                Table("position_listings", tables.POSITION_LISTINGS),
                Table("event_invalidations", tables.EVENT_INVALIDATIONS))),
    Stage(
        "fact_relevance", "retention",
        "A relevance score per fact: recency (halving every half_life_days from its last statement) x trust in its "
        "kind (FACT, PREDICTION, OPINION) x (1 + ln restatements). With archiving turned on (TKG_RETENTION, "
        "tkg/config/retention.yaml; off by default), facts below the threshold or past their kind's time-to-live move "
        "from the `facts` view to `facts_archive`; nothing is deleted.",
        code_version=lambda f: f"{RETENTION_VERSION}:{retention_settings().fingerprint()}",
        compute=invalidate.fact_relevance, inputs=("temporal_events",), kind="global",
        tables=(Table("fact_relevance", tables.FACT_RELEVANCE),)),
)
WAREHOUSE = Stage(
    "warehouse", "warehouse",
    "Publishes tkg.duckdb: a fresh file holding the Parquet tables (schema `raw`) and every SQL model, swapped into "
    "place atomically, so readers never block the pipeline and always see a consistent snapshot. Query it with "
    "`duckdb -readonly` or `tkg sql`. The checks run on the new file before the swap: if a blocking one fails, the "
    "new file is discarded and the last good one stays.",
    code_version=lambda f: warehouse_code_version(), inputs=tuple(stage.name for stage in STAGES), kind="global")
# The LLM accounting every step writes beside its output (tkg.build.stages.record_usage).
USAGE_TABLE = RawTable("llm_calls", "llm_calls", tables.LLM_CALLS, pattern="llm_calls/**/llm_calls.parquet")

BY_NAME: dict[str, Stage] = {stage.name: stage for stage in (*STAGES, WAREHOUSE)}
PARTITIONED: tuple[Stage, ...] = tuple(stage for stage in STAGES if stage.partitioned)
# The stages after the partitions and before the publish step: global and sharded, in order.
GLOBAL: tuple[Stage, ...] = tuple(stage for stage in STAGES if not stage.partitioned)
PARTITIONED_NAMES: tuple[str, ...] = tuple(stage.name for stage in PARTITIONED)


def shard_keys(shards: int) -> list[str]:
    """The shards' names ('00', '01', ...): their Dagster partition keys and folders."""
    width = max(2, len(str(shards - 1)))
    return [f"{number:0{width}d}" for number in range(shards)]


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


def _without(schema: pa.Schema, columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([field for field in schema if field.name not in columns])


def raw_tables() -> list[RawTable]:
    """The tables of the published file's `raw` schema: every stage's tables and the usage."""
    found = [RawTable(table.name, row.name, _without(table.schema, table.unpublished), None if row.partitioned else table.name,
                      dropped=table.unpublished, changes=table.changes)
             for row in STAGES if row.published for table in row.tables if table.published]
    return [*found, USAGE_TABLE]
