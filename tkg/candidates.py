"""Invalidation candidates (REFERENCE 1.8) for all events at once: blocks, sweeps and matrix
products instead of a loop over events.

For every incoming FACT, non-ATEMPORAL event X with bounds [xs, xe] (xe = invalid_at, or
valid_at when open), a candidate C must
1. share a canonical entity with X at triplet level, under a predicate of the same group;
2. overlap X in time: a STATIC C starts inside [xs, xe]; a DYNAMIC C contains xs (started at
   or before it and not ended before it) or starts inside [xs, xe];
3. have cosine >= min_cosine with X; the top `top_k` per X and candidate type are kept.

How: events are blocked by (canonical entity, predicate group). Inside a block, events are
sorted by valid_at, so the DYNAMIC candidates a chunk of incoming events can contain are a
prefix (a sweep over time), and their cosines are one matrix product per chunk; STATIC
candidates inside the bounds come from binary search. Ranking and de-duplication are polars
set operations. The top-k is computed per block first, which is exact: a fact among an event's
top k over all blocks is among its top k in the block that found it.

Restatements count once: candidates are ranked by the fact they state (`fact_key`, the
canonical triplets), so the same fact restated every quarter takes one of the k places, and
all its restatements come with it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

ROW_CHUNK = 512
PRUNE_EVERY = 2_000_000  # candidate rows held before ranking them
_NEVER = np.iinfo(np.int64).max

PAIRS_SCHEMA = pa.schema([
    ("primary_event_id", pa.string()), ("secondary_event_id", pa.string()), ("cosine", pa.float32()),
    ("shared_entity_id", pa.string()), ("predicate_group", pa.int8()),
])


def _micros(column: pa.ChunkedArray) -> np.ndarray:
    values = pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return np.asarray(values.fill_null(_NEVER).to_numpy(zero_copy_only=False), dtype=np.int64)


def _embeddings(column: pa.ChunkedArray) -> np.ndarray:
    flat = pc.list_flatten(column.combine_chunks())
    lengths = pc.list_value_length(column.combine_chunks()).to_numpy(zero_copy_only=False)
    if len(lengths) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    if (lengths != lengths[0]).any():
        raise ValueError("events carry embeddings of different sizes; rebuild temporal_events with one embedder")
    matrix = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(lengths), int(lengths[0]))
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


class _Facts:
    """The facts as arrays indexed 0..n-1 in event_id order."""

    def __init__(self, facts: pa.Table) -> None:
        facts = facts.sort_by("event_id")
        self.ids = np.asarray(facts.column("event_id").to_pylist(), dtype=object)
        self.vectors = _embeddings(facts.column("embedding"))
        self.start = _micros(facts.column("valid_at"))
        self.end_or_never = _micros(facts.column("invalid_at"))
        self.bound = np.where(self.end_or_never == _NEVER, self.start, self.end_or_never)
        self.dynamic = np.asarray(pc.equal(facts.column("temporal_type"), "DYNAMIC").to_numpy(zero_copy_only=False), dtype=bool)
        # sorted unique keys: rank ties break on the key text, the same whatever the input order
        _, self.key = np.unique(np.asarray(facts.column("fact_key").to_pylist(), dtype=object), return_inverse=True)
        self.index = {event_id: i for i, event_id in enumerate(self.ids)}


def _top_k_columns(scores: np.ndarray, keys: np.ndarray, top_k: int) -> np.ndarray:
    """Mask of the entries whose fact (key) is among each row's top_k facts by best score.

    `scores` is rows x candidates with -inf where a candidate does not qualify; ties between
    facts break on the smaller key, as the final ranking does."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    best = np.maximum.reduceat(scores[:, order], starts, axis=1)  # rows x facts, facts in key order
    if best.shape[1] > top_k:
        threshold = -np.partition(-best, top_k - 1, axis=1)[:, top_k - 1][:, None]
        above = best > threshold
        tied = best == threshold
        slots = top_k - above.sum(axis=1, keepdims=True)
        chosen = above | (tied & (np.cumsum(tied, axis=1) <= slots))
    else:
        chosen = np.ones_like(best, dtype=bool)
    chosen &= np.isfinite(best)
    fact_of_column = np.empty(len(keys), dtype=np.int64)
    fact_of_column[order] = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(keys)]))
    return chosen[:, fact_of_column] & np.isfinite(scores)


def _block_pairs(f: _Facts, members: np.ndarray, min_cosine: float, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(incoming, candidate, cosine) for one block, after the temporal and cosine filters, with
    the DYNAMIC candidates already cut to each incoming event's top_k facts in this block."""
    members = members[np.argsort(f.start[members], kind="stable")]
    dynamic = members[f.dynamic[members]]
    static = members[~f.dynamic[members]]
    dyn_start, dyn_end = f.start[dynamic], f.end_or_never[dynamic]
    static_start = f.start[static]
    found_x, found_c, found_s = [], [], []
    for offset in range(0, len(members), ROW_CHUNK):
        rows = members[offset : offset + ROW_CHUNK]
        xs, xe = f.start[rows][:, None], f.bound[rows][:, None]
        # DYNAMIC candidates: only those started by the latest bound of the chunk can qualify
        reach = np.searchsorted(dyn_start, xe.max(), side="right")
        if reach:
            columns = dynamic[:reach]
            cosine = f.vectors[rows] @ f.vectors[columns].T
            starts, ends = dyn_start[:reach][None, :], dyn_end[:reach][None, :]
            keep = (((starts <= xs) & (ends >= xs)) | ((starts >= xs) & (starts <= xe))) & (cosine >= min_cosine)
            keep &= rows[:, None] != columns[None, :]
            if keep.any():
                keep = _top_k_columns(np.where(keep, cosine, -np.inf), f.key[columns], top_k)
            r, c = np.nonzero(keep)
            found_x.append(rows[r])
            found_c.append(columns[c])
            found_s.append(cosine[r, c])
        # STATIC candidates: started inside [xs, xe], by binary search
        if len(static):
            low = np.searchsorted(static_start, f.start[rows], side="left")
            high = np.searchsorted(static_start, f.bound[rows], side="right")
            counts = high - low
            if counts.sum():
                incoming = np.repeat(rows, counts)
                positions = np.concatenate([np.arange(a, b) for a, b in zip(low, high) if b > a])
                candidates = static[positions]
                cosine = np.einsum("ij,ij->i", f.vectors[incoming], f.vectors[candidates])
                keep = (cosine >= min_cosine) & (incoming != candidates)
                found_x.append(incoming[keep])
                found_c.append(candidates[keep])
                found_s.append(cosine[keep])
    if not found_x:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.float32)
    return np.concatenate(found_x), np.concatenate(found_c), np.concatenate(found_s).astype(np.float32)


_FOUND_SCHEMA = {"incoming": pl.Int64, "candidate": pl.Int64, "cosine": pl.Float32, "candidate_dynamic": pl.Boolean,
                 "key": pl.Int64, "block": pl.Int64, "predicate_group": pl.Int8}


def _frame(f: _Facts, found: list[tuple[np.ndarray, ...]]) -> pl.DataFrame:
    incoming, candidate, cosine, block, group = (np.concatenate(parts) for parts in zip(*found))
    return pl.DataFrame({"incoming": incoming, "candidate": candidate, "cosine": cosine,
                         "candidate_dynamic": f.dynamic[candidate], "key": f.key[candidate].astype(np.int64),
                         "block": block, "predicate_group": group}, schema=_FOUND_SCHEMA)


def _deduplicated(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per (incoming, candidate): the best cosine, and the smallest block for the audit."""
    return frame.group_by(["incoming", "candidate"]).agg(
        pl.col("cosine").max(), pl.col("candidate_dynamic").first(), pl.col("key").first(),
        pl.col("block").min(), pl.col("predicate_group").min())


def _top_k(frame: pl.DataFrame, top_k: int) -> pl.DataFrame:
    """Keep, per incoming event and candidate type, the candidates of the top_k facts by cosine."""
    if frame.is_empty():
        return frame
    ranked = (
        frame.group_by(["incoming", "candidate_dynamic", "key"]).agg(pl.col("cosine").max().alias("key_cosine"))
        .sort(["incoming", "candidate_dynamic", "key_cosine", "key"], descending=[False, False, True, False])
        .with_columns(pl.int_range(pl.len()).over(["incoming", "candidate_dynamic"]).alias("rank"))
        .filter(pl.col("rank") < top_k)
        .select(["incoming", "candidate_dynamic", "key"])
    )
    return frame.join(ranked, on=["incoming", "candidate_dynamic", "key"], how="semi")


def select_candidates(facts: pa.Table, links: pa.Table, min_cosine: float = 0.5, top_k: int = 10) -> pa.Table:
    """Judge pairs (primary, secondary) with the best cosine, a shared entity and its group.

    `facts`: event_id, temporal_type, valid_at, invalid_at, embedding, fact_key (FACT,
    non-ATEMPORAL). `links`: event_id, canonical_id, predicate_group per triplet endpoint.
    Pairs are oriented both ways: an older DYNAMIC candidate may be retired by the incoming
    event, and an incoming DYNAMIC event by a candidate that starts after it; an event that
    has already ended can only be ended earlier.
    """
    if facts.num_rows == 0 or links.num_rows == 0:
        return PAIRS_SCHEMA.empty_table()
    f = _Facts(facts)
    blocks = (
        pl.from_arrow(links).select(["event_id", "canonical_id", "predicate_group"])
        .with_columns(pl.col("event_id").replace_strict(f.index, default=None, return_dtype=pl.Int64).alias("idx"))
        .drop_nulls("idx").unique(["idx", "canonical_id", "predicate_group"])
        .group_by(["canonical_id", "predicate_group"]).agg(pl.col("idx").sort())
        .filter(pl.col("idx").list.len() > 1)
        .sort(["canonical_id", "predicate_group"])
    )
    block_entities = np.asarray(blocks["canonical_id"].to_list(), dtype=object)
    pruned: list[pl.DataFrame] = []
    pending: list[tuple[np.ndarray, ...]] = []
    pending_rows = 0
    for block, (group, members) in enumerate(blocks.select(["predicate_group", "idx"]).iter_rows()):
        found = _block_pairs(f, np.asarray(members, dtype=np.int64), min_cosine, top_k)
        if len(found[0]):
            pending.append((*found, np.full(len(found[0]), block, dtype=np.int64), np.full(len(found[0]), group, dtype=np.int8)))
            pending_rows += len(found[0])
        if pending and (pending_rows > PRUNE_EVERY or block == len(block_entities) - 1):
            # Pruning a partial union is exact (all restatements of a fact share its blocks), so
            # each batch is ranked on its own and the survivors once more at the end.
            pruned.append(_top_k(_deduplicated(_frame(f, pending)), top_k))
            pending, pending_rows = [], 0
    if not pruned:
        return PAIRS_SCHEMA.empty_table()
    selected = _top_k(_deduplicated(pl.concat(pruned)), top_k)
    incoming, candidate = selected["incoming"].to_numpy(), selected["candidate"].to_numpy()
    older_candidate = f.dynamic[candidate] & (f.start[candidate] < f.start[incoming])
    later_candidate = f.dynamic[incoming] & (f.start[candidate] > f.start[incoming])
    primary = np.concatenate([candidate[older_candidate], incoming[later_candidate]])
    secondary = np.concatenate([incoming[older_candidate], candidate[later_candidate]])
    extra = selected.select(["cosine", "block", "predicate_group"])
    extra = pl.concat([extra.filter(pl.Series(older_candidate)), extra.filter(pl.Series(later_candidate))])
    still_open = (f.end_or_never[primary] == _NEVER) | (f.start[secondary] < f.end_or_never[primary])
    pairs = (
        extra.with_columns(primary=pl.Series(primary), secondary=pl.Series(secondary), keep=pl.Series(still_open))
        .filter(pl.col("keep"))
        .group_by(["primary", "secondary"]).agg(pl.col("cosine").max(), pl.col("block").min(), pl.col("predicate_group").min())
        .sort(["primary", "secondary"])  # indices follow event_id order
    )
    return pa.table({
        "primary_event_id": pa.array(f.ids[pairs["primary"].to_numpy()], pa.string()),
        "secondary_event_id": pa.array(f.ids[pairs["secondary"].to_numpy()], pa.string()),
        "cosine": pa.array(pairs["cosine"].to_numpy(), pa.float32()),
        "shared_entity_id": pa.array(block_entities[pairs["block"].to_numpy()], pa.string()),
        "predicate_group": pa.array(pairs["predicate_group"].to_numpy(), pa.int8()),
    }, schema=PAIRS_SCHEMA)
