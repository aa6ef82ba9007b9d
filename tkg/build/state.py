"""The state of the Parquet store: the stamps that say what every file was built from (see
tkg.core.versions), read against the stage catalog (tkg.build.catalog).

A partition is whole when each of its stage files was built from the version of its inputs
that the store holds; the global steps read only whole stores, so they never mix a new stage
with an old one. Planning (tkg.build.plan) reads nothing else, which keeps `tkg build` quick
when nothing changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import PurePath

from tkg.build.catalog import BY_NAME, GLOBAL, PARTITIONED, PARTITIONED_NAMES, Stage
from tkg.core.companies import Company, get_company, load_companies
from tkg.core.ids import short_version
from tkg.core.partitions import Partition, key_of, parse_key, sort_key
from tkg.core.versions import Stamp, combine
from tkg.ingest.parsing import SourceRow
from tkg.ingest.sources import rows_fingerprint
from tkg.store.manifest import stamped_files
from tkg.store.parquet import ParquetStore, listings_held


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


def stage_path(store: ParquetStore, stage: Stage, partition: Partition | None = None, shard: str | None = None) -> PurePath:
    """The file that carries a stage's stamp: a partition's file, a shard's last table, or a
    global stage's last table."""
    if stage.partitioned:
        return store.partition_path(stage.name, *partition)
    if stage.sharded:
        return store.shard_path(stage.name, shard, stage.table.name)
    return store.global_path(stage.name, stage.table.name)


@dataclass
class StoreState:
    """The stamps of what the store holds, read once (through the manifest, tkg.store.manifest)."""

    partitions: dict[Partition, dict[str, Stamp | None]]  # every partition with a stage file: each stage's stamp
    globals: dict[str, Stamp | None]  # each global stage's stamp (None: not built)
    shards: dict[str, dict[str, Stamp | None]]  # each shard stage's stamp per shard

    def stored(self) -> list[Partition]:
        """Every partition with at least one stage file, oldest first."""
        return sorted(self.partitions, key=sort_key)

    def stamps_of(self, partition: Partition) -> dict[str, Stamp | None]:
        return self.partitions.get(partition) or {name: None for name in PARTITIONED_NAMES}


def read_state(store: ParquetStore, shard_keys: list[str] | None = None, with_partitions: bool = True) -> StoreState:
    """The stamps of every partitioned, global and shard stage file of the store (the shards
    named by `shard_keys`, default none). Without partitions, the global and shard stages'
    alone: what a shard step reads (a few dozen files, where the partitions are 112,000 at 5M
    events, and a new quarter runs every shard of two shard steps). Inside
    `partitions_listed_once`, the partitions' stamps are the ones listed first."""
    shard_keys = shard_keys if shard_keys is not None else []
    stamp_files = {f"{stage.name}/{stage.table.name}.parquet": stage.name for stage in GLOBAL if not stage.sharded}
    globals_: dict[str, Stamp | None] = {name: None for name in stamp_files.values()}
    shards: dict[str, dict[str, Stamp | None]] = {stage.name: {key: None for key in shard_keys}
                                                   for stage in GLOBAL if stage.sharded}
    shard_files = {f"{stage.name}/shard={key}/{stage.table.name}.parquet": (stage.name, key)
                   for stage in GLOBAL if stage.sharded for key in shard_keys}
    for listed in stamped_files(store, [stage.name for stage in GLOBAL], wanted=lambda path: "/v=" not in path):
        if listed.path in stamp_files:
            globals_[stamp_files[listed.path]] = listed.stamp
        elif listed.path in shard_files:
            name, key = shard_files[listed.path]
            shards[name][key] = listed.stamp
    return StoreState(_partition_stamps(store) if with_partitions else {}, globals_, shards)


def _partition_stamps(store: ParquetStore) -> dict[Partition, dict[str, Stamp | None]]:
    """Every partition with a stage file, with each stage's stamp: listed now, or the listing
    `partitions_listed_once` holds for this store."""
    once = _PARTITIONS_ONCE.get()
    if once is None or once.root != store.parquet_root:
        return _list_partition_stamps(store)
    if once.partitions is None:
        once.partitions = _list_partition_stamps(store)
    return once.partitions


def _list_partition_stamps(store: ParquetStore) -> dict[Partition, dict[str, Stamp | None]]:
    partitions: dict[Partition, dict[str, Stamp | None]] = {}
    for listed in stamped_files(store, [stage.name for stage in PARTITIONED]):
        parts = listed.path.split("/")
        if len(parts) == 4 and parts[1].startswith("company=") and parts[2].startswith("quarter=") \
                and parts[3] == f"{parts[0]}.parquet" and parts[0] in PARTITIONED_NAMES:
            try:
                partition = parse_key(f"{parts[1].removeprefix('company=')}|{parts[2].removeprefix('quarter=')}")
            except ValueError:
                continue
            partitions.setdefault(partition, {name: None for name in PARTITIONED_NAMES})[parts[0]] = listed.stamp
    return partitions


@dataclass
class _ListedOnce:
    """The store whose partitions a run of the global steps lists once, and the listing (None
    until the state is first read); see partitions_listed_once."""

    root: PurePath
    partitions: dict[Partition, dict[str, Stamp | None]] | None = None


_PARTITIONS_ONCE: ContextVar[_ListedOnce | None] = ContextVar("tkg_partitions_once", default=None)


@contextmanager
def partitions_listed_once(store: ParquetStore) -> Iterator[None]:
    """Within: the partitions' stamps are listed once, at the first read of the state, and every
    later read takes them from that listing; the global and shard steps' stamps are read each
    time. For a run of the global steps, which writes no partition: each step read every
    partition's file information before and after it ran (16,082 partitions x 8 stages at 5M
    events, 2 CPU-s and 4 s each time). The steps' own listings of partition files take them
    from the same listing (`listings_held`). A partition built meanwhile by another run is seen
    by the next run of the global steps, as one built just after this run. Inside a hold of the
    same store (a step of such a run), a new one changes nothing."""
    before = _PARTITIONS_ONCE.get()
    if before is not None and before.root == store.parquet_root:  # inside a run's: its listing stands
        yield
        return
    _PARTITIONS_ONCE.set(_ListedOnce(store.parquet_root))
    try:
        with listings_held(store, PARTITIONED_NAMES):  # and the steps' own listings of partitions
            yield
    finally:  # set, not reset: a generator's frame may close in another context than it began in
        _PARTITIONS_ONCE.set(before)


def state_for(store: ParquetStore, stage: Stage, shard_keys: list[str], shard_step: bool
              ) -> tuple[StoreState, dict[str, dict[str, str]] | None]:
    """The store's state as a run of `stage` needs it, with every partition's versions after
    checking the partitions are whole (`consistent_versions`). A shard step of a stage that
    reads no partition gets the global and shard stages' stamps alone, and no versions (None):
    its shard reads only global steps' rows (see `stale_inputs`)."""
    with_partitions = not shard_step or any(BY_NAME[name].partitioned for name in stage.inputs)
    state = read_state(store, shard_keys, with_partitions)
    return state, consistent_versions(state) if with_partitions else None


def stored_partitions(store: ParquetStore) -> list[Partition]:
    """Every partition with at least one stage file in the store."""
    return read_state(store).stored()


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


def partial_partitions(state: StoreState) -> dict[str, dict[str, int]]:
    """Partitions built from a partial result, with what each lacks."""
    missing: dict[str, dict[str, int]] = {}
    for partition in state.stored():
        lacking: Counter = Counter()
        for stamp in state.partitions[partition].values():
            if stamp is not None:
                lacking.update(stamp.missing)
        if lacking:
            missing[key_of(*partition)] = dict(lacking)
    return missing


def consistent_versions(state: StoreState) -> dict[str, dict[str, str]]:
    """Per partitioned stage, the version of every partition, after checking that every
    partition in the store is whole. Raises HalfBuilt naming the partitions that are not, so
    no global step ever reads a mix of new and old stages."""
    versions: dict[str, dict[str, str]] = {name: {} for name in PARTITIONED_NAMES}
    problems = []
    for partition in state.stored():
        stamps = state.partitions[partition]
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


def stage_version(stage: Stage, state: StoreState, versions: dict[str, dict[str, str]] | None) -> str:
    """One version for what a stage holds now: its stamp's; every shard's, or every partition's,
    combined ('' for a global stage not built)."""
    if stage.partitioned:
        return combine(versions[stage.name])
    if stage.sharded:
        return combine({key: stamp.version if stamp else "" for key, stamp in state.shards[stage.name].items()})
    stamp = state.globals.get(stage.name)
    return stamp.version if stamp else ""


def global_inputs(stage: Stage, state: StoreState, versions: dict[str, dict[str, str]] | None, shard: str | None = None
                  ) -> dict[str, str]:
    """The inputs a global stage (or a shard of a shard stage) should be built from, given what
    the store holds: every partition of a partitioned input, every shard of a shard input,
    combined. A shard reads only its own rows of a global step's split tables: the fingerprint
    of those rows stands for that input, so the shard is current while they are unchanged.
    With `versions` None (the partitions' stamps were not read), partitioned inputs are left out."""
    inputs = outside_versions(stage)
    for upstream in stage.inputs:
        row = BY_NAME[upstream]
        if shard is not None and row.shard_tables:
            stamp = state.globals.get(upstream)
            inputs[upstream] = f"rows:{stamp.parts.get(shard, 'none')}" if stamp is not None else ""
        elif row.partitioned and versions is None:
            continue
        else:
            inputs[upstream] = stage_version(row, state, versions)
    if shard is not None:
        inputs["shard"] = shard
    return inputs


def warehouse_inputs(versions: dict[str, dict[str, str]], state: StoreState) -> dict[str, str]:
    """What the published file is built from: every partition and every global and shard step."""
    inputs = {name: combine(by_partition) for name, by_partition in versions.items()}
    for stage in GLOBAL:
        inputs[stage.name] = stage_version(stage, state, versions)
    return inputs


def _stamp_reason(stage: Stage, stamp: Stamp | None, expected: dict[str, str], code_versions: dict[str, str] | None,
                  unread: frozenset[str] = frozenset()) -> str | None:
    """Why `stamp` is not what `stage` would be built from now (`expected`; the inputs `unread`
    were not read, and are not compared)."""
    if stamp is None:
        return "missing"
    if code_versions is not None and stamp.code_version != code_versions[stage.name]:
        return "code changed"
    if {name: version for name, version in stamp.inputs.items() if name not in unread} != expected:
        return "older than its inputs"
    if not stamp.complete:
        return "incomplete"
    return None


def stale_stage(stage: Stage, state: StoreState, versions: dict[str, dict[str, str]] | None,
                code_versions: dict[str, str] | None = None) -> str | None:
    """Why a global or shard stage does not cover what it reads (None: it does): missing, older
    than its inputs, incomplete, or (when `code_versions` are given) built by other code. A
    shard stage is current when every shard is. With `versions` None, against the global and
    shard stages it reads alone, not the partitions."""
    unread = frozenset(name for name in stage.inputs if BY_NAME[name].partitioned) if versions is None else frozenset()
    if not stage.sharded:
        reason = _stamp_reason(stage, state.globals.get(stage.name), global_inputs(stage, state, versions), code_versions,
                               unread)
        return f"{'code changed: ' + stage.name if reason == 'code changed' else stage.name + ' ' + reason}" if reason else None
    stale = Counter()
    for key, stamp in state.shards[stage.name].items():
        reason = _stamp_reason(stage, stamp, global_inputs(stage, state, versions, key), code_versions, unread)
        if reason:
            stale[reason] += 1
    if not stale:
        return None
    total = len(state.shards[stage.name])
    return f"{stage.name}: " + ", ".join(f"{count} of {total} shard(s) {reason}" for reason, count in sorted(stale.items()))


def stale_globals(versions: dict[str, dict[str, str]], state: StoreState,
                  code_versions: dict[str, str] | None = None) -> list[str]:
    """Why the global and shard steps (before the warehouse) do not cover the partitions."""
    return [reason for stage in GLOBAL if (reason := stale_stage(stage, state, versions, code_versions))]


def stale_inputs(stage: Stage, state: StoreState, versions: dict[str, dict[str, str]] | None) -> list[str]:
    """The global and shard stages `stage` reads that are missing or older than their own
    inputs: it must not run before they are rebuilt. With `versions` None (a shard step, which
    reads none of the partitions' stamps), older than the global and shard stages they read:
    whether they cover the newest partitions is theirs to check when they run. A shard's output
    is a function of the rows it reads, so it is right for the global step as it stands, and it
    runs again when that step's rows of the shard change."""
    problems = []
    for upstream in stage.inputs:
        row = BY_NAME[upstream]
        if row.partitioned:
            continue
        reason = stale_stage(row, state, versions)
        if reason:
            problems.append(reason + ("; materialise it first" if not row.sharded else "; materialise every shard first"))
    return problems
