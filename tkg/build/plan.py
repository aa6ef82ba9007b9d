"""What a build has to do: which partitions are stale, from which stage, and why.

A partition's expected versions follow from its source rows, its company's registry entry and
the stages' code versions (`tkg.core.versions`); its stored versions are stamped in its Parquet
files. The first stage whose two versions differ, and everything downstream of it, is rebuilt.
The global steps rerun when any partition changed or their own stamps are out of date.
`tkg build`, `tkg status`, the schedule and the sensor all plan with this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tkg.build import catalog
from tkg.build.catalog import downstream_of
from tkg.build.state import (
    HalfBuilt,
    StoreState,
    consistent_versions,
    outside_versions,
    read_state,
    stale_globals,
    warehouse_inputs,
)
from tkg.core.partitions import Partition, key_of, sort_key
from tkg.core.versions import Stamp
from tkg.ingest.sources import LoadedSource, SourceProblem
from tkg.store.parquet import ParquetStore


@dataclass(frozen=True)
class PartitionPlan:
    partition: Partition
    stages: frozenset[str]  # the stages to rebuild (closed downstream); empty when up to date
    reason: str  # 'new', 'source changed', 'code changed: triplets', 'incomplete: ...'

    @property
    def key(self) -> str:
        return key_of(*self.partition)


@dataclass
class BuildPlan:
    work: list[PartitionPlan] = field(default_factory=list)  # stale partitions of the selection, oldest first
    current: list[Partition] = field(default_factory=list)  # up to date
    held: dict[Partition, list[SourceProblem]] = field(default_factory=dict)  # a bad row: kept as built, not rebuilt
    stored_elsewhere: list[Partition] = field(default_factory=list)  # built, but not in this selection of the source
    global_reasons: list[str] = field(default_factory=list)  # why resolution/invalidation/warehouse must run

    @property
    def up_to_date(self) -> bool:
        return not self.work and not self.global_reasons


def expected_stamps(rows, company: str, code_versions: dict[str, str]) -> dict[str, Stamp]:
    """The stamps a partition's stages would carry if built now from `rows`."""
    stamps: dict[str, Stamp] = {}
    for stage in catalog.PARTITIONED:
        inputs = outside_versions(stage, rows, company)
        inputs.update({upstream: stamps[upstream].version for upstream in stage.inputs})
        stamps[stage.name] = Stamp(stage.name, code_versions[stage.name], inputs)
    return stamps


def _stale_stages(expected: dict[str, Stamp], stored: dict[str, Stamp | None]) -> tuple[set[str], str]:
    stale: set[str] = set()
    reasons: list[str] = []
    for stage in catalog.PARTITIONED_NAMES:
        have, want = stored[stage], expected[stage]
        if have is None:
            stale.add(stage)
            reasons.append(f"{stage} missing")
        elif not have.complete:
            stale.add(stage)
            reasons.append(f"{stage} incomplete ({', '.join(f'{n} {k}' for k, n in sorted(have.missing.items()))})")
        elif have.code_version != want.code_version:
            stale.add(stage)
            reasons.append(f"code changed: {stage}")
        elif have.inputs != want.inputs:
            stale.add(stage)
            if stage == "transcripts":
                changed = [name for name in ("source", "company") if have.inputs.get(name) != want.inputs.get(name)]
                reasons.append("source rows changed" if changed == ["source"] else "company registry entry changed"
                               if changed == ["company"] else "source and registry changed")
            elif not any(upstream in stale for upstream in catalog.stage(stage).inputs):
                reasons.append(f"{stage} half-built")
    if not stale:
        return stale, ""
    if all(stored[stage] is None for stage in catalog.PARTITIONED_NAMES):
        return set(catalog.PARTITIONED_NAMES), "new"
    return downstream_of(stale), "; ".join(reasons)


def plan_build(store: ParquetStore, source: LoadedSource, selection: list[Partition], code_versions: dict[str, str],
               force: bool = False, warehouse_stamp: Stamp | None = None, shards: int = 8) -> BuildPlan:
    """Compare what the store holds with what `selection` (partitions of `source`) should hold
    (with the global half split into `shards`)."""
    plan = BuildPlan()
    problems = source.problem_partitions()
    state = read_state(store, catalog.shard_keys(shards))
    for partition in sorted(selection, key=sort_key):
        stored = state.stamps_of(partition)
        if partition in problems and any(stored.values()):
            plan.held[partition] = problems[partition]
            continue
        expected = expected_stamps(source.rows_for(*partition), partition[0], code_versions)
        stages, reason = _stale_stages(expected, stored)
        if force:
            stages, reason = set(catalog.PARTITIONED_NAMES), reason or "forced"
        if stages:
            plan.work.append(PartitionPlan(partition, frozenset(stages), reason))
        else:
            plan.current.append(partition)
    chosen = set(selection)
    plan.stored_elsewhere = [p for p in state.stored() if p not in chosen]
    if plan.work:
        plan.global_reasons.append(f"{len(plan.work)} partition(s) to build")
    elif force:
        plan.global_reasons.append("forced")
    else:
        plan.global_reasons.extend(global_staleness(state, code_versions, warehouse_stamp))
    return plan


def global_staleness(state: StoreState, code_versions: dict[str, str], warehouse_stamp: Stamp | None) -> list[str]:
    """Why the global steps must run although no partition changed (empty: they need not)."""
    try:
        versions = consistent_versions(state)
    except HalfBuilt as error:
        return [str(error)]
    reasons = stale_globals(versions, state, code_versions)
    if reasons:
        return reasons
    if warehouse_stamp is None:
        return ["warehouse not published"]
    if warehouse_stamp.code_version != code_versions["warehouse"]:
        return ["code changed: warehouse (SQL models)"]
    if warehouse_stamp.inputs != warehouse_inputs(versions, state):
        return ["warehouse older than its inputs"]
    return []
