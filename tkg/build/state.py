"""The state of the Parquet store: stages and their inputs, code versions, and the stamps that
say what every file was built from (see tkg.core.versions).

A partition is whole when each of its stage files was built from the version of its inputs
that the store holds; the global steps read only whole stores, so they never mix a new stage
with an old one. Planning (tkg.build.plan) reads nothing else, which keeps `tkg build` quick when
nothing changed.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

from tkg.core.companies import Company, get_company, load_companies
from tkg.core.partitions import Partition, key_of, parse_key, sort_key
from tkg.core.versions import Stamp, combine
from tkg.ingest.chunking import ChunkingSettings
from tkg.ingest.parsing import SourceRow
from tkg.ingest.sources import rows_fingerprint
from tkg.store.parquet import ParquetStore

PARTITIONED_STAGES = ("transcripts", "chunks", "statements", "temporal_events", "triplets", "figures", "entities")
GLOBAL_STAGES = ("canonical_entities", "invalidated_events", "warehouse")
STAGE_INPUTS: dict[str, tuple[str, ...]] = {
    "transcripts": (),  # the partition's source rows and its company's registry entry
    "chunks": ("transcripts",),
    "statements": ("transcripts", "chunks"),
    "temporal_events": ("transcripts", "statements"),
    "triplets": ("transcripts", "statements"),
    "figures": ("transcripts", "chunks", "statements"),
    "entities": ("triplets",),
}
# Code versions of the stages that no prompt or model shapes; bump one when its output changes.
TRANSCRIPTS_VERSION = "streetevents-parser-1"
CHUNKS_VERSION = "semantic-chunks-1"
ENTITIES_VERSION = "entity-mentions-1"
RESOLUTION_VERSION = "entity-resolution-2"
RETENTION_VERSION = "fact-relevance-1"
WAREHOUSE_VERSION = "warehouse-2"


def _short(*parts: object) -> str:
    return hashlib.sha256(":".join(str(part) for part in parts).encode()).hexdigest()[:16]


def downstream_of(stages: set[str]) -> set[str]:
    """`stages` and every partitioned stage that reads one of them, directly or not."""
    closed = set(stages)
    for stage in PARTITIONED_STAGES:
        if any(upstream in closed for upstream in STAGE_INPUTS[stage]):
            closed.add(stage)
    return closed


def stage_code_versions(extractor_fingerprint: Callable[[str], str], embedder_name: str, chunk_embedder_name: str,
                        chunking: ChunkingSettings = ChunkingSettings()) -> dict[str, str]:
    """The code version of every partitioned stage: what, besides its inputs, shapes its output
    (prompt template, model and settings, or rule set). The Dagster assets carry the same."""
    return {
        "transcripts": TRANSCRIPTS_VERSION,
        "chunks": _short(CHUNKS_VERSION, repr(chunking), chunk_embedder_name),
        "statements": extractor_fingerprint("statements"),
        "temporal_events": _short(extractor_fingerprint("validity"), embedder_name),
        "triplets": extractor_fingerprint("triplets"),
        "figures": extractor_fingerprint("figures"),
        "entities": _short(ENTITIES_VERSION, embedder_name),
    }


def company_fingerprint(company: Company) -> str:
    """The registry entry a partition's transcripts are parsed with (an input, like the rows)."""
    return _short(company.ticker, company.name, "|".join(company.aliases), company.fiscal_year_end_month)


def registry_fingerprint() -> str:
    return _short(*(company_fingerprint(company) for _, company in sorted(load_companies().items())))


def source_inputs(rows: list[SourceRow], company: str) -> dict[str, str]:
    """The inputs of a partition's `transcripts` stage."""
    return {"source": rows_fingerprint(rows), "company": company_fingerprint(get_company(company))}


class HalfBuilt(RuntimeError):
    """Partitions whose stage files do not agree (a build stopped between two stages)."""


def stored_partitions(store: ParquetStore) -> list[Partition]:
    """Every partition with at least one stage file in the store."""
    found = set()
    for stage in PARTITIONED_STAGES:
        for path in store.partition_files(stage):
            folder = path.parent
            try:
                found.add(parse_key(f"{folder.parent.name.removeprefix('company=')}|{folder.name.removeprefix('quarter=')}"))
            except ValueError:
                continue
    return sorted(found, key=sort_key)


def partition_stamps(store: ParquetStore, partition: Partition) -> dict[str, Stamp | None]:
    return {stage: store.stamp(store.partition_path(stage, *partition)) for stage in PARTITIONED_STAGES}


def half_built(stamps: dict[str, Stamp | None]) -> str | None:
    """Why a partition's stage files do not agree, or None when they do."""
    for stage in PARTITIONED_STAGES:
        stamp = stamps[stage]
        if stamp is None:
            return f"{stage} is missing or carries no version"
        for upstream in STAGE_INPUTS[stage]:
            if stamps[upstream] is not None and stamp.inputs.get(upstream) != stamps[upstream].version:
                return f"{stage} was built from another {upstream}"
    return None


def partial_partitions(store: ParquetStore) -> dict[str, dict[str, int]]:
    """Partitions built from a partial result, with what each lacks."""
    missing: dict[str, dict[str, int]] = {}
    for partition in stored_partitions(store):
        lacking: Counter = Counter()
        for stamp in partition_stamps(store, partition).values():
            if stamp is not None:
                lacking.update(stamp.missing)
        if lacking:
            missing[key_of(*partition)] = dict(lacking)
    return missing


def consistent_versions(store: ParquetStore) -> dict[str, dict[str, str]]:
    """Per partitioned stage, the version of every partition, after checking that every
    partition in the store is whole. Raises HalfBuilt naming the partitions that are not, so
    no global step ever reads a mix of new and old stages."""
    versions: dict[str, dict[str, str]] = {stage: {} for stage in PARTITIONED_STAGES}
    problems = []
    for partition in stored_partitions(store):
        stamps = partition_stamps(store, partition)
        reason = half_built(stamps)
        if reason:
            problems.append(f"{key_of(*partition)} ({reason})")
            continue
        for stage, stamp in stamps.items():
            versions[stage][key_of(*partition)] = stamp.version
    if problems:
        raise HalfBuilt(f"{len(problems)} partition(s) are half-built, so the graph is not refreshed: "
                        f"{'; '.join(problems[:10])}{' ...' if len(problems) > 10 else ''}. Rerun `tkg build` "
                        "(or materialise those partitions in the UI) to complete them")
    return versions


def judge_code_version(name: str, fingerprint: str = "") -> str:
    return f"{name}:{fingerprint}" if fingerprint else name


def warehouse_code_version() -> str:
    """The published file's code version: it covers every SQL model."""
    from tkg.store.warehouse import load_models

    return _short(WAREHOUSE_VERSION, *(model.sha256 for model in load_models()))


def global_code_versions(judge_version: str) -> dict[str, str]:
    from tkg.invalidate.retention import retention_settings

    return {"canonical_entities": RESOLUTION_VERSION, "invalidated_events": judge_version,
            "fact_relevance": f"{RETENTION_VERSION}:{retention_settings().fingerprint()}",
            "warehouse": warehouse_code_version()}


def global_stamps(store: ParquetStore) -> dict[str, Stamp | None]:
    return {"canonical_entities": store.stamp(store.global_path("canonical_entities")),
            "invalidated_events": store.stamp(store.global_path("invalidated_events", "event_invalidations")),
            "fact_relevance": store.stamp(store.global_path("fact_relevance"))}


def warehouse_inputs(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None]) -> dict[str, str]:
    """What the published file is built from: every partition and every global step."""
    inputs = {stage: combine(by_partition) for stage, by_partition in versions.items()}
    for stage, stamp in stamps.items():
        inputs[stage] = stamp.version if stamp else ""
    return inputs


def global_inputs(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None]) -> dict[str, dict[str, str]]:
    """The inputs each global step should have been built from, given the partition versions
    and the stamps of the global steps it reads."""
    canonical = stamps.get("canonical_entities")
    return {
        "canonical_entities": {"entities": combine(versions["entities"]), "registry": registry_fingerprint()},
        "invalidated_events": {"temporal_events": combine(versions["temporal_events"]), "triplets": combine(versions["triplets"]),
                               "figures": combine(versions["figures"]), "canonical_entities": canonical.version if canonical else ""},
        "fact_relevance": {"temporal_events": combine(versions["temporal_events"])},
    }


def stale_globals(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None],
                  code_versions: dict[str, str] | None = None) -> list[str]:
    """Why the global steps (before the warehouse) do not cover the partitions: missing, older
    than their inputs, incomplete, or (when `code_versions` are given) built by other code."""
    expected = global_inputs(versions, stamps)
    reasons = []
    for stage, inputs in expected.items():
        stamp = stamps[stage]
        if stamp is None:
            reasons.append(f"{stage} missing")
        elif code_versions is not None and stamp.code_version != code_versions[stage]:
            reasons.append(f"code changed: {stage}")
        elif stamp.inputs != inputs:
            reasons.append(f"{stage} older than its inputs")
        elif not stamp.complete:
            reasons.append(f"{stage} incomplete")
    return reasons