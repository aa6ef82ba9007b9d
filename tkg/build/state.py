"""The state of the Parquet store: the stamps that say what every file was built from (see
tkg.core.versions), read against the stage catalog (tkg.build.catalog).

A partition is whole when each of its stage files was built from the version of its inputs
that the store holds; the global steps read only whole stores, so they never mix a new stage
with an old one. Planning (tkg.build.plan) reads nothing else, which keeps `tkg build` quick
when nothing changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import PurePath

from tkg.build.catalog import GLOBAL, PARTITIONED, PARTITIONED_NAMES, Stage
from tkg.core.companies import Company, get_company, load_companies
from tkg.core.ids import short_version
from tkg.core.partitions import Partition, key_of, parse_key, sort_key
from tkg.core.versions import Stamp, combine
from tkg.ingest.parsing import SourceRow
from tkg.ingest.sources import rows_fingerprint
from tkg.store.parquet import ParquetStore


class HalfBuilt(RuntimeError):
    """Partitions whose stage files do not agree (a build stopped between two stages), or a
    global step asked to run before the steps it reads."""


def company_fingerprint(company: Company) -> str:
    """The registry entry a partition's transcripts are parsed with (an input, like the rows)."""
    return short_version(company.ticker, company.name, "|".join(company.aliases), company.fiscal_year_end_month)


def registry_fingerprint() -> str:
    return short_version(*(company_fingerprint(company) for _, company in sorted(load_companies().items())))


# The versions of what stages read besides other stages (a catalog row's `outside_inputs`).
OUTSIDE_INPUTS: dict[str, Callable[[list[SourceRow], str | None], str]] = {
    "source": lambda rows, company: rows_fingerprint(rows),  # the partition's source rows
    "company": lambda rows, company: company_fingerprint(get_company(company)),  # its registry entry
    "registry": lambda rows, company: registry_fingerprint(),  # the whole company registry
}


def outside_versions(stage: Stage, rows: list[SourceRow] | None = None, company: str | None = None) -> dict[str, str]:
    return {name: OUTSIDE_INPUTS[name](rows or [], company) for name in stage.outside_inputs}


def stage_path(store: ParquetStore, stage: Stage, partition: Partition | None = None) -> PurePath:
    """The file that carries a stage's stamp: a partition's file, or a global stage's last table."""
    if stage.partitioned:
        return store.partition_path(stage.name, *partition)
    return store.global_path(stage.name, stage.table.name)


def stored_partitions(store: ParquetStore) -> list[Partition]:
    """Every partition with at least one stage file in the store."""
    found = set()
    for name in PARTITIONED_NAMES:
        for path in store.partition_files(name):
            folder = path.parent
            try:
                found.add(parse_key(f"{folder.parent.name.removeprefix('company=')}|{folder.name.removeprefix('quarter=')}"))
            except ValueError:
                continue
    return sorted(found, key=sort_key)


def partition_stamps(store: ParquetStore, partition: Partition) -> dict[str, Stamp | None]:
    return {stage.name: store.stamp(stage_path(store, stage, partition)) for stage in PARTITIONED}


def half_built(stamps: dict[str, Stamp | None]) -> str | None:
    """Why a partition's stage files do not agree, or None when they do."""
    for stage in PARTITIONED:
        stamp = stamps[stage.name]
        if stamp is None:
            return f"{stage.name} is missing or carries no version"
        for upstream in stage.inputs:
            if stamps[upstream] is not None and stamp.inputs.get(upstream) != stamps[upstream].version:
                return f"{stage.name} was built from another {upstream}"
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
    versions: dict[str, dict[str, str]] = {name: {} for name in PARTITIONED_NAMES}
    problems = []
    for partition in stored_partitions(store):
        stamps = partition_stamps(store, partition)
        reason = half_built(stamps)
        if reason:
            problems.append(f"{key_of(*partition)} ({reason})")
            continue
        for name, stamp in stamps.items():
            versions[name][key_of(*partition)] = stamp.version
    if problems:
        raise HalfBuilt(f"{len(problems)} partition(s) are half-built, so the graph is not refreshed: "
                        f"{'; '.join(problems[:10])}{' ...' if len(problems) > 10 else ''}. Rerun `tkg build` "
                        "(or materialise those partitions in the UI) to complete them")
    return versions


def global_stamps(store: ParquetStore) -> dict[str, Stamp | None]:
    return {stage.name: store.stamp(stage_path(store, stage)) for stage in GLOBAL}


def global_inputs(stage: Stage, versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None]) -> dict[str, str]:
    """The inputs a global stage should be built from, given the partition versions and the
    stamps of the global stages it reads: every partition of a partitioned input, combined."""
    inputs = outside_versions(stage)
    for upstream in stage.inputs:
        if upstream in versions:
            inputs[upstream] = combine(versions[upstream])
        else:
            stamp = stamps.get(upstream)
            inputs[upstream] = stamp.version if stamp else ""
    return inputs


def warehouse_inputs(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None]) -> dict[str, str]:
    """What the published file is built from: every partition and every global step."""
    inputs = {name: combine(by_partition) for name, by_partition in versions.items()}
    for stage in GLOBAL:
        stamp = stamps.get(stage.name)
        inputs[stage.name] = stamp.version if stamp else ""
    return inputs


def stale_globals(versions: dict[str, dict[str, str]], stamps: dict[str, Stamp | None],
                  code_versions: dict[str, str] | None = None) -> list[str]:
    """Why the global steps (before the warehouse) do not cover the partitions: missing, older
    than their inputs, incomplete, or (when `code_versions` are given) built by other code."""
    reasons = []
    for stage in GLOBAL:
        stamp = stamps[stage.name]
        if stamp is None:
            reasons.append(f"{stage.name} missing")
        elif code_versions is not None and stamp.code_version != code_versions[stage.name]:
            reasons.append(f"code changed: {stage.name}")
        elif stamp.inputs != global_inputs(stage, versions, stamps):
            reasons.append(f"{stage.name} older than its inputs")
        elif not stamp.complete:
            reasons.append(f"{stage.name} incomplete")
    return reasons


def stale_inputs(stage: Stage, store: ParquetStore, versions: dict[str, dict[str, str]]) -> list[str]:
    """The global stages `stage` reads that are missing or older than their own inputs: it
    must not run before they are rebuilt."""
    stamps = global_stamps(store)
    problems = []
    for upstream in stage.inputs:
        row = next((other for other in GLOBAL if other.name == upstream), None)
        if row is None:
            continue
        stamp = stamps.get(upstream)
        if stamp is None:
            problems.append(f"{upstream} has not been materialised yet")
        elif stamp.inputs != global_inputs(row, versions, stamps):
            problems.append(f"{upstream} is older than the partitions it should cover")
    return problems
