"""Invalidation candidates (REFERENCE 1.8) for all events at once: blocks, sweeps and matrix
products instead of a loop over events.

For every incoming FACT, non-ATEMPORAL event X with bounds [xs, xe] (xe = invalid_at, or
valid_at when open), a candidate C must
1. share a canonical entity with X at triplet level, under a predicate of the same group;
2. overlap X in time: a STATIC C starts inside [xs, xe]; a DYNAMIC C contains xs (started at
   or before it and not ended before it) or starts inside [xs, xe];
3. have cosine >= min_cosine with X; the top `top_k` per X and candidate type are kept.

Restatements count once: candidates are ranked by the fact they state (`fact_key`, the
canonical triplets), so the same fact restated every quarter takes one of the k places.

Each selected (X, candidate) is a judge pair oriented from the older event to the newer one:
an older DYNAMIC candidate may be retired by X, and a DYNAMIC X by a candidate that starts
after it. The restatements of a fact state the same canonical triplets, so of a primary's
pairs with the restatements of one fact only the earliest can set its `invalid_at` (the
earliest retirement wins). That one pair is kept: the judge is not asked the same question
once per quarter.

How, in two vectorised steps:
1. Rank. Events are blocked by (canonical entity, predicate group); small blocks are packed
   into one batch. Inside a batch events are in time order, so the candidates a chunk of
   incoming events can reach are a range (a sweep over time). Their cosines are one matrix
   product per chunk, reduced to the best cosine per (X, fact) and cut to X's top_k facts;
   batches run on all cores. These rows are per block (so a block whose members did not
   change keeps its rows); `select_ranked` cuts them over all blocks and shards in SQL.
   Cutting per block first is exact: a fact among X's top k over all blocks is among its top
   k in every block that holds it (all restatements of a fact share its blocks).
2. Pair. For each selected (X, fact), the earliest qualifying restatement on each side is
   found by binary search over events in time order, and cosines are computed only for the
   pairs that could be kept (a failed cosine passes the turn to the next restatement).

Cosines are computed on embeddings rounded so that float32 holds every dot product exactly
(`exact_vectors`): the same pair gets the same cosine whichever product computed it. The
sharded steps get them rounded already, as integers (`vector_blobs`, `blob_vectors`).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from threadpoolctl import threadpool_limits

from tkg.core import tables
from tkg.core.arrays import run_starts
from tkg.core.embeddings import embedding_matrix, normalise_rows

ROW_CHUNK = 512  # incoming events per matrix product in a large block
MAX_CELLS = 8 * 2**20  # cosines in one product (32 MB): a block of millions of events is swept in thinner chunks
BATCH_ROWS = 256  # small blocks are packed into one product up to this many events
EXPAND_CHUNK = 4096  # pairs whose cosines are computed at once (gathers that stay in cache)
_NEVER = np.iinfo(np.int64).max
QUANTUM = 2**11  # embedding components are rounded to multiples of 1 / QUANTUM (see exact_vectors)
_MIXED_EMBEDDINGS = "some events carry no embedding or one of another size; rebuild temporal_events with one embedder"
# the cores this process may run on (a container's share, not the host's count)
WORKERS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

PAIRS_SCHEMA = pa.schema([
    ("primary_event_id", pa.string()), ("secondary_event_id", pa.string()), ("cosine", pa.float32()),
    ("shared_entity_id", pa.string()), ("predicate_group", pa.int8()),
])


def _micros(column: pa.ChunkedArray) -> np.ndarray:
    values = pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return np.asarray(values.fill_null(_NEVER).to_numpy(zero_copy_only=False), dtype=np.int64)


def exact_vectors(embeddings: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Unit vectors (zero rows stay zero) rounded to multiples of 1 / QUANTUM, as float32.

    A product of two such components is a multiple of 2**-22, and every partial sum of a dot
    product stays below 2 in magnitude (Cauchy-Schwarz; rounding moves a norm by at most
    sqrt(d) / 4096), so float32 holds it exactly: a cosine comes out bit-identical whatever
    kernel, chunk or summation order computed it, and ties between near-identical statements
    break the same way in every run. The rounding moves a cosine by about 2e-4.

    `rows`: take these rows, in this order."""
    vectors = normalise_rows(embeddings if rows is None else np.asarray(embeddings)[rows])
    vectors *= QUANTUM
    np.rint(vectors, out=vectors)
    vectors /= QUANTUM
    return vectors


def vector_blobs(embeddings: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each embedding of a list<float> column as its exact vector (`exact_vectors`) in binary:
    the multiples of 1 / QUANTUM as little-endian int16 (|component| <= 1, so at most QUANTUM).
    Half the bytes of the floats, and whoever reads them back (`blob_vectors`) neither
    normalises nor rounds. A row is rounded by itself, so a vector does not depend on the rows
    around it; a null embedding stays null."""
    lists = embeddings.combine_chunks() if isinstance(embeddings, pa.ChunkedArray) else embeddings
    lengths = pc.fill_null(pc.list_value_length(lists), -1).to_numpy(zero_copy_only=False)
    widths = np.unique(lengths[lengths >= 0])
    if len(widths) == 1 and lists.null_count == 0:  # one embedder, every row (the usual case): one pass
        width = int(widths[0])
        data = _rounded(lists.flatten().to_numpy(zero_copy_only=False), width)
        offsets = np.arange(len(lists) + 1, dtype=np.int64) * (2 * width)
        large = offsets[-1] > np.iinfo(np.int32).max
        return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(lists),
                                     [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(data)])
    blobs: list[bytes | None] = [None] * len(lists)
    for width in widths:
        rows = np.flatnonzero(lengths == width)
        data = _rounded(lists.take(pa.array(rows)).flatten().to_numpy(zero_copy_only=False), int(width))
        step = 2 * int(width)
        for number, row in enumerate(rows):
            blobs[row] = data[number * step:(number + 1) * step]
    return pa.array(blobs, pa.binary())


def _rounded(values: np.ndarray, width: int) -> bytes:
    """Rows of `width` floats as their exact vectors' multiples of 1 / QUANTUM (int16 bytes)."""
    if width == 0:
        return b""
    matrix = np.asarray(values, dtype=np.float32).reshape(-1, width)
    return (exact_vectors(matrix) * QUANTUM).astype("<i2").tobytes()  # whole numbers already: exact


def blob_vectors(blobs: pa.Array | pa.ChunkedArray, rows: np.ndarray | None = None) -> np.ndarray:
    """The float32 matrix of `vector_blobs` (`rows`: these rows, in this order): the same
    values `exact_vectors` gives for the embeddings. Raises when a row has no vector or one of
    another size (two embedders in one store)."""
    array = blobs.combine_chunks() if isinstance(blobs, pa.ChunkedArray) else blobs
    if not len(array):
        return np.zeros((0, 0), dtype=np.float32)
    smallest, largest = (value.as_py() for value in pc.min_max(pc.binary_length(array)).values())
    if array.null_count or smallest != largest or not largest or largest % 2:
        raise ValueError(_MIXED_EMBEDDINGS)
    width = largest // 2
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    start = int(np.frombuffer(array.buffers()[1], dtype=offset_type, count=1, offset=array.offset * np.dtype(offset_type).itemsize)[0])
    integers = np.frombuffer(array.buffers()[2], dtype="<i2", count=len(array) * width, offset=start).reshape(-1, width)
    vectors = (integers if rows is None else integers[rows]).astype(np.float32)
    vectors /= QUANTUM
    return vectors


def _vectors(facts: pa.Table, order: np.ndarray) -> np.ndarray:
    """The facts' exact vectors in `order`: from their `vector` (rounded by fact_blocks) or
    rounded here from their `embedding`."""
    if "vector" in facts.column_names:
        return blob_vectors(facts.column("vector"), order)
    matrix, present = embedding_matrix(facts.column("embedding"))
    if not present.all():
        raise ValueError(_MIXED_EMBEDDINGS)
    return exact_vectors(matrix, order)


class _Facts:
    """The facts as arrays indexed 0..n-1 in event_id order."""

    def __init__(self, facts: pa.Table) -> None:
        order = pc.sort_indices(facts.column("event_id")).to_numpy()

        def column(name: str) -> pa.ChunkedArray:
            return facts.column(name).take(order)

        self.ids = column("event_id").combine_chunks()
        self.vectors = _vectors(facts, order)
        self.start = _micros(column("valid_at"))
        self.end_or_never = _micros(column("invalid_at"))
        self.bound = np.where(self.end_or_never == _NEVER, self.start, self.end_or_never)
        # A DYNAMIC candidate qualifies iff reach >= xs and start <= xe: it contains xs, or
        # starts inside [xs, xe] (reach is its end, never before its start).
        self.reach = np.maximum(self.end_or_never, self.start)
        # position in (valid_at, event_id) order
        self.time_position = np.empty(len(self.start), dtype=np.int64)
        self.time_position[np.argsort(self.start, kind="stable")] = np.arange(len(self.start))
        self.dynamic = np.asarray(pc.equal(column("temporal_type"), "DYNAMIC").to_numpy(zero_copy_only=False), dtype=bool)
        # keys numbered in text order: rank ties break on the key text, whatever the input order
        self.key_text = column("fact_key").combine_chunks()
        self.key = pl.Series(self.key_text).rank("dense").to_numpy().astype(np.int64) - 1
        # an event stating each key (key k's first event), to name a key by its text
        self.first_of_key = np.zeros(int(self.key.max()) + 1 if len(self.key) else 0, dtype=np.int64)
        self.first_of_key[self.key[::-1]] = np.arange(len(self.key))[::-1]


def _sorting(*keys: tuple[np.ndarray, int]) -> np.ndarray:
    """Indices that sort by several non-negative integer keys, most significant first, each
    given with an exclusive bound: one int64 sort when the bounds fit in 62 bits, else lexsort.
    Rows equal on every key may come in any order."""
    if math.prod(bound for _, bound in keys) < 2**62:
        composite = np.zeros(len(keys[0][0]), dtype=np.int64)
        for values, bound in keys:
            composite *= bound
            composite += values
        return np.argsort(composite)
    return np.lexsort(tuple(values for values, _ in reversed(keys)))


# --- 1. rank ----------------------------------------------------------------------------------


def _top_facts(scores: np.ndarray, group_starts: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fact, row, best cosine) for each row's top_k facts by best score.

    `scores` is candidates x rows, with the candidates grouped by fact (fact f's candidates
    start at group_starts[f]) and -inf where a candidate does not qualify; ties between facts
    break on the smaller fact, as the final ranking does (facts are in key order)."""
    best = np.maximum.reduceat(scores, group_starts, axis=0) if len(group_starts) < scores.shape[0] else scores
    if best.shape[0] > top_k:
        threshold = -np.partition(-best, top_k - 1, axis=0)[top_k - 1][None, :]
        above = best > threshold
        tied = best == threshold
        slots = top_k - above.sum(axis=0, keepdims=True)
        chosen = above | (tied & (np.cumsum(tied, axis=0) <= slots))
        chosen &= np.isfinite(best)
    else:
        chosen = np.isfinite(best)
    facts, rows = np.nonzero(chosen)
    return facts, rows, best[facts, rows]


def _batch_ranks(f: _Facts, members: np.ndarray, labels: np.ndarray, min_cosine: float, top_k: int,
                 row_ok: np.ndarray | None = None, column_ok: np.ndarray | None = None) -> list[tuple[np.ndarray, ...]]:
    """(incoming, fact key, best cosine, candidate is DYNAMIC, block) for each incoming event's
    top_k facts per candidate type, in each block of a batch: `members` are the blocks' events
    and `labels` their blocks. Small blocks share a batch (one matrix product, cross-block
    pairs masked out); a large block is a batch of its own, swept in chunks of rows.

    `row_ok`, `column_ok` (parallel to `members`): when given, only these members are ranked
    as incoming events, or only these are their candidates."""
    several = labels[0] != labels[-1]  # labels come sorted
    by_start = np.argsort(f.start[members], kind="stable")
    members, labels = members[by_start], labels[by_start]
    row_ok = np.ones(len(members), dtype=bool) if row_ok is None else row_ok[by_start]
    column_ok = np.ones(len(members), dtype=bool) if column_ok is None else column_ok[by_start]
    out: list[tuple[np.ndarray, ...]] = []
    for dynamic_type in (True, False):
        is_column = (f.dynamic[members] == dynamic_type) & column_ok
        if not is_column.any():
            continue
        columns_all, column_labels = members[is_column], labels[is_column]
        is_row = row_ok
        if not dynamic_type:
            # A STATIC candidate can only ever retire a DYNAMIC X that has an end (it must start
            # after xs and before X's end), so the other events need no STATIC ranking.
            is_row = row_ok & f.dynamic[members] & (f.end_or_never[members] != _NEVER)
        if not is_row.any():
            continue
        rows_all, row_labels_all = members[is_row], labels[is_row]
        column_start = f.start[columns_all]
        # Columns grouped by fact (stable, so in time order inside a fact) for the per-fact best.
        by_fact = np.argsort(f.key[columns_all], kind="stable")
        step = max(1, min(ROW_CHUNK, MAX_CELLS // len(columns_all)))
        for offset in range(0, len(rows_all), step):
            rows, row_labels = rows_all[offset : offset + step], row_labels_all[offset : offset + step]
            xs, xe = f.start[rows][None, :], f.bound[rows][None, :]
            # rows and columns are in time order: the columns a chunk can reach are a range
            low = 0 if dynamic_type else np.searchsorted(column_start, xs.min(), side="left")
            high = np.searchsorted(column_start, xe.max(), side="right")
            if high <= low:
                continue
            order = by_fact[(by_fact >= low) & (by_fact < high)] if low or high < len(by_fact) else by_fact
            columns = columns_all[order]
            # candidates x rows, so that the per-fact reduction runs over contiguous rows
            cosine = f.vectors[columns] @ f.vectors[rows].T
            column_start_now = f.start[columns][:, None]
            if dynamic_type:
                drop = (f.reach[columns][:, None] < xs) | (column_start_now > xe)
            else:
                drop = (column_start_now < xs) | (column_start_now > xe)
            drop |= (cosine < min_cosine) | (columns[:, None] == rows[None, :])
            if several:
                drop |= column_labels[order][:, None] != row_labels[None, :]
            if drop.all():
                continue
            np.putmask(cosine, drop, -np.inf)
            keys = f.key[columns]
            group_starts = run_starts(keys)
            fact, r, best = _top_facts(cosine, group_starts, top_k)
            out.append((rows[r], keys[group_starts[fact]], best, np.full(len(r), dynamic_type, dtype=bool), row_labels[r]))
    return out


def _ranked(f: _Facts, blocks: pl.DataFrame, min_cosine: float, top_k: int, delta: bool = False) -> dict[str, np.ndarray]:
    """incoming, candidate_dynamic, key, cosine, block for each incoming event's top_k facts per
    candidate type in each block (the cut over all blocks is `select_ranked`'s).

    `delta`: the blocks carry `fresh` (parallel to `idx`), and only what the fresh members
    change is ranked: fresh incoming events against every member, the others against the
    fresh members alone (`rank_candidates`)."""
    sizes = blocks["idx"].list.len().to_numpy()
    members = blocks["idx"].explode().to_numpy().astype(np.int64)
    fresh = blocks["fresh"].explode().to_numpy().astype(bool) if delta else None
    labels = np.repeat(np.arange(len(sizes)), sizes)
    offsets = np.r_[0, np.cumsum(sizes)]
    batches, first = [], 0
    while first < len(sizes):
        last = first + 1  # consecutive small blocks share a batch, up to BATCH_ROWS events
        while last < len(sizes) and offsets[last + 1] - offsets[first] <= BATCH_ROWS:
            last += 1
        batches.append(slice(offsets[first], offsets[last]))
        first = last
    # numpy releases the GIL in the products, masks and reductions, so batches run on all
    # cores (BLAS on one thread each, not one per core per batch); map keeps their order
    def rank(batch: slice) -> list[tuple[np.ndarray, ...]]:
        if fresh is None:
            return _batch_ranks(f, members[batch], labels[batch], min_cosine, top_k)
        return (_batch_ranks(f, members[batch], labels[batch], min_cosine, top_k, row_ok=fresh[batch])
                + _batch_ranks(f, members[batch], labels[batch], min_cosine, top_k, row_ok=~fresh[batch], column_ok=fresh[batch]))

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=WORKERS) as pool:
        parts = [part for found in pool.map(rank, batches) for part in found]
    if not parts:
        return {}
    incoming, key, cosine, dynamic, block = (np.concatenate(arrays) for arrays in zip(*parts))
    n, facts = len(f.key), int(f.key.max()) + 1
    order = _sorting((block, len(sizes)), (incoming, n), (dynamic.astype(np.int64), 2), (key, facts))
    return {"incoming": incoming[order], "candidate_dynamic": dynamic[order], "key": key[order],
            "cosine": cosine[order], "block": block[order]}


# --- 2. expand and orient, 3. reduce -----------------------------------------------------------


def _cosines(f: _Facts, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosines of the pairs (a[i], b[i]), in chunks whose gathers stay in cache, on all cores."""
    out = np.empty(len(a), dtype=np.float32)

    def chunk(at: int) -> None:
        left = np.take(f.vectors, a[at : at + EXPAND_CHUNK], axis=0)
        right = np.take(f.vectors, b[at : at + EXPAND_CHUNK], axis=0)
        out[at : at + EXPAND_CHUNK] = np.einsum("ij,ij->i", left, right)

    if len(a) <= EXPAND_CHUNK:
        chunk(0)
    else:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(chunk, range(0, len(a), EXPAND_CHUNK)))
    return out


def _first_qualifying(f: _Facts, anchor: np.ndarray, pool: np.ndarray, position: np.ndarray, stop: np.ndarray,
                      limit: np.ndarray, min_cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """For each query i, the first pool[position[i]:stop[i]] (events in time order) that starts
    before limit[i] and has cosine >= min_cosine with anchor[i]: (pool position or -1, cosine).

    Cosines are computed for each query's current candidate only; a failure passes the turn to
    the next one, and a candidate starting at or after the limit ends the search."""
    position = position.copy()
    found = np.full(len(anchor), -1, dtype=np.int64)
    cosine = np.zeros(len(anchor), dtype=np.float32)
    open_ = np.flatnonzero(position < stop)
    while len(open_):
        open_ = open_[f.start[pool[position[open_]]] < limit[open_]]
        scores = _cosines(f, anchor[open_], pool[position[open_]])
        passed = scores >= min_cosine
        found[open_[passed]], cosine[open_[passed]] = position[open_[passed]], scores[passed]
        open_ = open_[~passed]
        position[open_] += 1
        open_ = open_[position[open_] < stop[open_]]
    return found, cosine


def _earliest_pairs(f: _Facts, selected: dict[str, np.ndarray], min_cosine: float) -> dict[str, np.ndarray]:
    """Judge pairs from the selected (X, fact) rows: per primary and fact of the secondary, the
    earliest secondary that qualifies, with its cosine and the smallest block and group that
    selected it; sorted by (primary, secondary).

    (a) An older DYNAMIC restatement c of a selected fact K is retired by X when c starts
    before xs and is still open after it (then c contains xs, so it qualifies in time). Per
    (c, fact of X), only the earliest such X counts: the selecting X of one fact, in time
    order, are swept once per restatement of K.
    (b) A DYNAMIC X with an end is retired by a restatement of K that starts after xs and
    before X's end (inside X's bounds); the earliest one counts. An open X has no later
    candidates at all: its bounds are [xs, xs].
    """
    incoming, key, candidate_dynamic = selected["incoming"], selected["key"], selected["candidate_dynamic"]
    block, group = selected["block"], selected["predicate_group"]
    n = len(f.key)
    _, when = np.unique(f.start, return_inverse=True)  # start times ranked; ties share a rank
    when = when.astype(np.int64)
    span = int(when.max()) + 2
    # restatements by (fact, type), each run in (valid_at, event_id) order
    facts = int(f.key.max()) + 1
    order = _sorting((f.key * 2 + f.dynamic, 2 * facts), (f.time_position, n))
    slot_of = f.key[order] * 2 + f.dynamic[order]
    slots = np.arange(2 * facts)
    first, last = np.searchsorted(slot_of, slots, side="left"), np.searchsorted(slot_of, slots, side="right")
    run_position = slot_of * span + when[order]

    def expand(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        counts = high - low
        owner = np.repeat(np.arange(len(low)), counts)
        return owner, np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts - low, counts)

    found = []
    # (a): selected DYNAMIC facts, grouped by (fact of X, fact K); X in time order in a group
    rows = np.flatnonzero(candidate_dynamic)
    rows = rows[_sorting((f.key[incoming[rows]], facts), (key[rows], facts), (f.time_position[incoming[rows]], n))]
    xs_of = incoming[rows]
    group_first = run_starts(f.key[xs_of], key[rows])
    group_stop = np.r_[group_first[1:], len(rows)].astype(np.int64)
    group_id = np.repeat(np.arange(len(group_first)), group_stop - group_first)
    # every DYNAMIC restatement c of K, against its group's X
    k = key[rows[group_first]]
    owner, at = expand(first[k * 2 + 1], last[k * 2 + 1])
    c = order[at]
    position = np.searchsorted(group_id * span + when[xs_of], owner * span + when[c], side="right")
    hit, cosine = _first_qualifying(f, c, xs_of, position, group_stop[owner], f.end_or_never[c], min_cosine)
    chosen = hit >= 0
    found.append((c[chosen], xs_of[hit[chosen]], cosine[chosen], block[rows[hit[chosen]]], group[rows[hit[chosen]]]))
    # (b): a DYNAMIC X with an end, against the restatements of each fact it selected
    rows = np.flatnonzero(f.dynamic[incoming] & (f.end_or_never[incoming] != _NEVER))
    slot = key[rows] * 2 + candidate_dynamic[rows]
    position = np.searchsorted(run_position, slot * span + when[incoming[rows]], side="right")
    hit, cosine = _first_qualifying(f, incoming[rows], order, position, last[slot], f.end_or_never[incoming[rows]], min_cosine)
    chosen = hit >= 0
    found.append((incoming[rows[chosen]], order[hit[chosen]], cosine[chosen], block[rows[chosen]], group[rows[chosen]]))

    primary, secondary, cosine, block, group = (np.concatenate(parts) for parts in zip(*found))
    # union: per (primary, fact of the secondary) the earliest secondary, then one row per pair
    by_fact_time = _sorting((f.key, facts), (f.time_position, n))
    rank = np.empty(n, dtype=np.int64)
    rank[by_fact_time] = np.arange(n)
    composite = primary * n + rank[secondary]
    sort = np.argsort(composite)
    primary, secondary, cosine, block, group, composite = (a[sort] for a in (primary, secondary, cosine, block, group, composite))
    earliest = np.zeros(len(primary), dtype=bool)
    earliest[run_starts(primary, f.key[secondary])] = True
    same_pair = run_starts(composite)
    block, group = np.minimum.reduceat(block, same_pair), np.minimum.reduceat(group, same_pair)
    keep = earliest[same_pair]
    runs = same_pair[keep]
    final = np.argsort(primary[runs] * n + secondary[runs])
    return {"primary": primary[runs][final], "secondary": secondary[runs][final], "cosine": cosine[runs][final],
            "block": block[keep][final], "predicate_group": group[keep][final]}


# --- the phases, on tables ---------------------------------------------------------------------
# Candidate selection runs in three phases, so that its two heavy ones can run per shard of the
# blocks (tkg.invalidate.stages) and only their small outputs meet:
# 1. `rank_candidates`: in some blocks, each incoming event's top_k facts per candidate type;
# 2. `select_ranked`: over the ranks of every shard, each incoming event's top_k facts overall,
#    with the smallest block that holds the event and the fact (the shard that pairs them);
# 3. `pair_candidates`: in that block's shard, the earliest restatements that make the pairs.
# Cutting to top_k per shard is exact: a fact's best cosine with an event is the same in every
# block that holds both, so a fact among the event's top_k overall is among its top_k in any
# shard that holds it. Pairing is local: all restatements of a fact share its blocks, so the
# smallest common block of an event's fact and a selected fact holds every event the pairing
# of the two facts reads.

RANKS_SCHEMA = tables.CANDIDATE_RANKS


def _blocks(f: _Facts, links: pa.Table, fresh: str | None = None) -> pl.DataFrame:
    """The blocks (canonical entity, predicate group) of two or more facts, in (entity, group)
    order, with each member's `fresh` flag when `fresh` names a column of `links`."""
    flags = [pl.col(fresh).alias("fresh")] if fresh else []
    return (
        pl.from_arrow(links).select(["event_id", "canonical_id", "predicate_group", *flags])
        .join(pl.DataFrame({"event_id": pl.Series(f.ids), "idx": np.arange(len(f.ids), dtype=np.int64)}), on="event_id")
        .unique(["idx", "canonical_id", "predicate_group"])
        .sort("idx")
        .group_by(["canonical_id", "predicate_group"], maintain_order=True).agg("idx", *(["fresh"] if fresh else []))
        .filter(pl.col("idx").list.len() > 1)
        .sort(["canonical_id", "predicate_group"])
    )


def rank_candidates(facts: pa.Table, links: pa.Table, min_cosine: float = 0.5, top_k: int = 10,
                    fresh: str | None = None) -> pa.Table:
    """Phase 1, over the blocks `links` make of `facts` (all of them, one shard's, or some
    blocks'): in each block, each incoming event's top_k facts per candidate type with their
    best cosine in the block. A block's rows depend on its members alone.

    `facts`: event_id, temporal_type, valid_at, invalid_at, embedding (or vector, see
    `vector_blobs`), fact_key (FACT, non-ATEMPORAL). `links`: event_id, canonical_id,
    predicate_group per triplet endpoint.

    `fresh`: a boolean column of `links` marking the members a block gained since its ranks
    were last computed (the others unchanged). Then only the rows those members change are
    ranked: each fresh event against every member, each other event against the fresh
    members alone. `merge_ranks` over these rows and the block's earlier ones gives its full
    ranks: a fact's best cosine over all members is its best over the old ones or over the
    fresh ones, and a fact among an event's top k on all members is among its top k on
    whichever of the two gives its best (cosines are exact, ties break on the fact key)."""
    if facts.num_rows == 0 or links.num_rows == 0:
        return RANKS_SCHEMA.empty_table()
    f = _Facts(facts)
    blocks = _blocks(f, links, fresh)
    ranked = _ranked(f, blocks, min_cosine, top_k, delta=fresh is not None)
    if not ranked:
        return RANKS_SCHEMA.empty_table()
    return pa.table({
        "incoming_event_id": pc.take(f.ids, ranked["incoming"]).cast(pa.string()),
        "candidate_dynamic": pa.array(ranked["candidate_dynamic"], pa.bool_()),
        "fact_key": pc.take(f.key_text, f.first_of_key[ranked["key"]]).cast(pa.string()),
        "cosine": pa.array(ranked["cosine"], pa.float32()),
        "block_entity": pc.take(blocks["canonical_id"].to_arrow(), ranked["block"]).cast(pa.string()),
        "block_group": pc.take(blocks["predicate_group"].to_arrow(), ranked["block"]).cast(pa.int8()),
        "predicate_group": pc.take(blocks["predicate_group"].to_arrow(), ranked["block"]).cast(pa.int8()),
    }, schema=RANKS_SCHEMA)


SELECT_RANKED_SQL = """
    WITH best AS (
        SELECT incoming_event_id, candidate_dynamic, fact_key, max(cosine) AS cosine,
               min({'e': block_entity, 'g': block_group}) AS block, min(predicate_group) AS predicate_group
        FROM {ranks} GROUP BY incoming_event_id, candidate_dynamic, fact_key
    )
    SELECT incoming_event_id, candidate_dynamic, fact_key, cosine, block.e AS block_entity, block.g AS block_group,
           predicate_group
    FROM best
    QUALIFY row_number() OVER (PARTITION BY incoming_event_id, candidate_dynamic ORDER BY cosine DESC, fact_key) <= $top_k"""


MERGE_RANKS_SQL = """
    SELECT incoming_event_id, candidate_dynamic, fact_key, max(cosine) AS cosine, block_entity, block_group,
           predicate_group
    FROM {ranks} GROUP BY block_entity, block_group, predicate_group, incoming_event_id, candidate_dynamic, fact_key
    QUALIFY row_number() OVER (PARTITION BY block_entity, block_group, incoming_event_id, candidate_dynamic
                               ORDER BY max(cosine) DESC, fact_key) <= $top_k"""


def merge_ranks(connection, ranks: str, top_k: int = 10):
    """A block's ranks from parts that each ranked some of its pairs (its earlier ranks and
    `rank_candidates(..., fresh=...)`'s): per incoming event, fact and candidate type the best
    cosine, cut to the event's top_k facts per type in the block, ties on the fact key.
    `ranks` is a relation or view on `connection`; the result is a DuckDB relation."""
    return connection.sql(MERGE_RANKS_SQL.replace("{ranks}", ranks), params={"top_k": top_k})


def select_ranked(connection, ranks: str, top_k: int = 10):
    """Phase 2: the ranks of every shard (the relation or view named `ranks` on `connection`)
    cut to each incoming event's top_k facts per candidate type overall, ties on the fact key;
    each fact with its best cosine, its smallest block (the shard that pairs it) and smallest
    group. A DuckDB relation, in no set order (its readers pair the rows whatever their order,
    and sorting them costs more than choosing them): it runs out of core."""
    return connection.sql(SELECT_RANKED_SQL.replace("{ranks}", ranks), params={"top_k": top_k})


def pair_candidates(facts: pa.Table, selected: pa.Table, min_cosine: float = 0.5) -> pa.Table:
    """Phase 3: judge pairs (primary, secondary) with their cosine, a shared entity and its group,
    from the selected (incoming event, fact) rows. `facts` must hold every restatement of the
    facts involved (a shard's facts hold them for the rows whose smallest block is theirs).
    The primary is the older event (DYNAMIC), the secondary the newer one that might retire
    it; per primary and fact of the secondary, only the earliest secondary is kept."""
    if facts.num_rows == 0 or selected.num_rows == 0:
        return PAIRS_SCHEMA.empty_table()
    f = _Facts(facts)
    incoming = pc.index_in(selected.column("incoming_event_id"), value_set=f.ids)
    key_names = pc.take(f.key_text, f.first_of_key)  # key k's text at position k
    keys = pc.index_in(selected.column("fact_key"), value_set=key_names)
    if incoming.null_count or keys.null_count:
        raise ValueError("selected rows name events or facts the shard's facts do not hold")
    block_order = pl.from_arrow(selected.select(["block_entity", "block_group"])).unique().sort(["block_entity", "block_group"])
    block_number = (pl.from_arrow(selected.select(["block_entity", "block_group"]))
                    .join(block_order.with_row_index("number"), on=["block_entity", "block_group"], how="left",
                          maintain_order="left")["number"])
    chosen = {
        "incoming": incoming.to_numpy().astype(np.int64),
        "candidate_dynamic": np.asarray(selected.column("candidate_dynamic").to_numpy(zero_copy_only=False), dtype=bool),
        "key": keys.to_numpy().astype(np.int64),
        "block": block_number.to_numpy().astype(np.int64),
        "predicate_group": np.asarray(selected.column("predicate_group").to_numpy(zero_copy_only=False), dtype=np.int64),
    }
    pairs = _earliest_pairs(f, chosen, min_cosine)
    return pa.table({
        "primary_event_id": pc.take(f.ids, pairs["primary"]).cast(pa.string()),
        "secondary_event_id": pc.take(f.ids, pairs["secondary"]).cast(pa.string()),
        "cosine": pa.array(pairs["cosine"], pa.float32()),
        "shared_entity_id": pc.take(block_order["block_entity"].to_arrow(), pairs["block"]).cast(pa.string()),
        "predicate_group": pa.array(pairs["predicate_group"], pa.int8()),
    }, schema=PAIRS_SCHEMA)


def select_candidates(facts: pa.Table, links: pa.Table, min_cosine: float = 0.5, top_k: int = 10) -> pa.Table:
    """The three phases on one set of facts: every judge pair, as `pair_candidates` describes."""
    import duckdb

    ranks = rank_candidates(facts, links, min_cosine, top_k)
    with duckdb.connect() as connection:
        connection.register("ranks", ranks)
        selected = select_ranked(connection, "ranks", top_k).to_arrow_table().cast(RANKS_SCHEMA)
    return pair_candidates(facts, selected, min_cosine)
