"""Candidate selection against a plain, event-by-event reading of REFERENCE 1.8 on random data."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tkg.invalidate.candidates import (
    blob_vectors,
    exact_vectors,
    merge_ranks,
    pair_candidates,
    rank_candidates,
    select_candidates,
    select_ranked,
    vector_blobs,
)

NEVER = datetime.max.replace(tzinfo=timezone.utc)


def random_graph(seed: int, events: int = 400, entities: int = 12):
    rng = random.Random(seed)
    base = datetime(2016, 1, 1, tzinfo=timezone.utc)
    centres = np.random.default_rng(seed).standard_normal((6, 32))
    facts, links = [], []
    for i in range(events):
        valid = base + timedelta(days=rng.randrange(0, 1500, 30))  # calls share dates, like quarterly restatements
        dynamic = rng.random() < 0.6
        invalid = valid + timedelta(days=rng.randrange(30, 600)) if dynamic and rng.random() < 0.3 else None
        if not dynamic and rng.random() < 0.2:
            invalid = None
        vector = centres[rng.randrange(6)] + 0.6 * np.random.default_rng(seed * 1000 + i).standard_normal(32)
        key = f"k{rng.randrange(events // 3)}"  # some events restate the same fact
        facts.append({"event_id": f"e{i:04d}", "temporal_type": "DYNAMIC" if dynamic else "STATIC", "valid_at": valid,
                      "invalid_at": invalid, "embedding": (vector / np.linalg.norm(vector)).astype(np.float32).tolist(),
                      "fact_key": key})
        for entity in rng.sample(range(entities), rng.choice([1, 1, 2])):
            links.append({"event_id": f"e{i:04d}", "canonical_id": f"ent{entity}", "predicate_group": rng.choice([1, 4])})
    # restatements must share their links (they state the same canonical triplets)
    by_key = defaultdict(list)
    for fact in facts:
        by_key[fact["fact_key"]].append(fact["event_id"])
    first_links = defaultdict(list)
    for link in links:
        first_links[link["event_id"]].append(link)
    links = [{**link, "event_id": event_id} for ids in by_key.values() for event_id in ids for link in first_links[ids[0]]]
    schema = pa.schema([("event_id", pa.string()), ("temporal_type", pa.string()), ("valid_at", pa.timestamp("us", tz="UTC")),
                        ("invalid_at", pa.timestamp("us", tz="UTC")), ("embedding", pa.list_(pa.float32())), ("fact_key", pa.string())])
    link_schema = pa.schema([("event_id", pa.string()), ("canonical_id", pa.string()), ("predicate_group", pa.int8())])
    return pa.Table.from_pylist(facts, schema=schema), pa.Table.from_pylist(links, schema=link_schema)


def brute_force(facts: pa.Table, links: pa.Table, min_cosine=0.5, top_k=10) -> set[tuple[str, str]]:
    """REFERENCE 1.8 read literally, one incoming event at a time; then, per primary and fact of
    the secondary, only the earliest secondary (restatements of a fact ask the judge the same
    question, and the earliest retirement wins)."""
    rows = {r["event_id"]: r for r in facts.to_pylist()}
    # cosines of the unit embeddings as tkg rounds them (exact_vectors), in float64
    vector = dict(zip(rows, exact_vectors(np.asarray([r["embedding"] for r in rows.values()])).astype(np.float64)))
    shared = defaultdict(set)
    for a in links.to_pylist():
        for b in links.to_pylist():
            if a["event_id"] != b["event_id"] and a["canonical_id"] == b["canonical_id"] and a["predicate_group"] == b["predicate_group"]:
                shared[a["event_id"]].add(b["event_id"])
    pairs = set()
    for x_id, x in rows.items():
        xs, xe = x["valid_at"], x["invalid_at"] or x["valid_at"]
        scored = []
        for c_id in shared[x_id]:
            c = rows[c_id]
            if c["temporal_type"] == "STATIC":
                overlaps = xs <= c["valid_at"] <= xe
            else:
                overlaps = (c["valid_at"] <= xs and (c["invalid_at"] or NEVER) >= xs) or xs <= c["valid_at"] <= xe
            cosine = float(vector[x_id] @ vector[c_id])
            if overlaps and cosine >= min_cosine:
                scored.append((c, cosine))
        for kind in ("STATIC", "DYNAMIC"):
            best: dict[str, float] = {}
            for c, cosine in scored:
                if c["temporal_type"] == kind:
                    best[c["fact_key"]] = max(best.get(c["fact_key"], -1.0), cosine)
            keep = {key for key, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]}
            for c, _ in scored:
                if c["temporal_type"] != kind or c["fact_key"] not in keep:
                    continue
                if c["temporal_type"] == "DYNAMIC" and c["valid_at"] < xs:
                    primary, secondary = c, x
                elif x["temporal_type"] == "DYNAMIC" and c["valid_at"] > xs:
                    primary, secondary = x, c
                else:
                    continue
                if primary["invalid_at"] is None or secondary["valid_at"] < primary["invalid_at"]:
                    pairs.add((primary["event_id"], secondary["event_id"]))
    earliest: dict[tuple[str, str], dict] = {}
    for primary_id, secondary_id in pairs:
        secondary = rows[secondary_id]
        slot = (primary_id, secondary["fact_key"])
        if slot not in earliest or (secondary["valid_at"], secondary_id) < (earliest[slot]["valid_at"], earliest[slot]["event_id"]):
            earliest[slot] = secondary
    return {(primary_id, secondary["event_id"]) for (primary_id, _), secondary in earliest.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_the_literal_reading(seed):
    facts, links = random_graph(seed)
    selected = select_candidates(facts, links)
    found = set(zip(selected.column("primary_event_id").to_pylist(), selected.column("secondary_event_id").to_pylist()))
    expected = brute_force(facts, links)
    assert len(expected) > 100
    assert found == expected


def test_does_not_depend_on_row_order():
    facts, links = random_graph(4)
    shuffled = facts.take(np.random.default_rng(0).permutation(facts.num_rows))
    assert select_candidates(facts, links).equals(select_candidates(shuffled, links))


def test_chunks_and_packed_blocks_match_the_literal_reading(monkeypatch):
    """Chunk and batch boundaries inside blocks change nothing: the same graph with tiny chunks
    (many products per block, many blocks per product) gives the literal reading's pairs."""
    import tkg.invalidate.candidates as candidates

    facts, links = random_graph(5, events=300, entities=6)
    monkeypatch.setattr(candidates, "ROW_CHUNK", 7)
    monkeypatch.setattr(candidates, "BATCH_ROWS", 40)
    monkeypatch.setattr(candidates, "EXPAND_CHUNK", 5)
    selected = select_candidates(facts, links)
    assert set(zip(selected.column("primary_event_id").to_pylist(), selected.column("secondary_event_id").to_pylist())) == brute_force(facts, links)


def _sorted_ranks(table: pa.Table) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in ("block_entity", "block_group", "incoming_event_id",
                                                           "candidate_dynamic", "fact_key")])


@pytest.mark.parametrize(("seed", "chunk"), [(11, 512), (12, 512), (13, 5)])
def test_a_grown_block_merged_from_its_new_pairs_equals_it_ranked_in_full(seed, chunk, monkeypatch):
    """A block that gains members (a new quarter's facts, or an older fact a merge brings in)
    needs only the pairs with a new member ranked: merged with its earlier ranks, they give
    the block ranked in full, row for row, including ties between facts stated in the same
    words and facts pushed out of an event's top k by new ones."""
    import duckdb

    import tkg.invalidate.candidates as candidates

    monkeypatch.setattr(candidates, "ROW_CHUNK", chunk)
    facts, links = random_graph(seed, events=500, entities=5)
    rng = np.random.default_rng(seed)
    embeddings = facts.column("embedding").to_pylist()
    for i in rng.choice(np.arange(1, len(embeddings)), len(embeddings) // 5, replace=False):
        embeddings[i] = embeddings[i - 1]  # the same words: equal cosines, so ties on the fact key
    facts = facts.set_column(facts.schema.get_field_index("embedding"), "embedding",
                             pa.array(embeddings, pa.list_(pa.float32())))
    new = set(rng.choice(facts.column("event_id").to_pylist(), facts.num_rows // 4, replace=False).tolist())
    is_new = pa.array([event in new for event in links.column("event_id").to_pylist()])
    top_k, min_cosine = 3, 0.3
    earlier = rank_candidates(facts, links.filter(pc.invert(is_new)), min_cosine, top_k)
    delta = rank_candidates(facts, links.append_column("fresh", is_new), min_cosine, top_k, fresh="fresh")
    full = rank_candidates(facts, links, min_cosine, top_k)
    with duckdb.connect() as connection:
        connection.register("parts", pa.concat_tables([earlier, delta]))
        merged = merge_ranks(connection, "parts", top_k).to_arrow_table().cast(full.schema)
    assert full.num_rows > 1000 and delta.num_rows < full.num_rows
    assert _sorted_ranks(merged).equals(_sorted_ranks(full))
    # the merge did cut: some earlier rows lost their place to a new member's fact
    kept = set(zip(*(full.column(name).to_pylist() for name in ("block_entity", "incoming_event_id", "fact_key"))))
    assert any(row not in kept for row in zip(*(earlier.column(name).to_pylist()
                                                for name in ("block_entity", "incoming_event_id", "fact_key"))))
    tied = full.group_by(["block_entity", "incoming_event_id", "candidate_dynamic", "cosine"]).aggregate([("fact_key", "count")])
    assert max(tied.column("fact_key_count").to_pylist()) > 1  # ties among an event's kept facts were exercised


def test_exact_vectors_give_the_same_cosine_from_any_product():
    rng = np.random.default_rng(7)
    raw = rng.standard_normal((300, 256)).astype(np.float32)
    raw[:40] = raw[40:80] + 1e-3 * rng.standard_normal((40, 256)).astype(np.float32)  # near-duplicates
    raw[5] = 0
    raw[6, 3] = np.nan
    vectors = exact_vectors(raw)
    whole = vectors @ vectors.T
    pieces = np.vstack([vectors[i : i + 37] @ vectors[::-1].T[:, ::-1] for i in range(0, 300, 37)])
    rowwise = np.einsum("ij,ij->i", vectors[np.arange(300)], vectors[np.arange(300)[::-1]])
    assert np.array_equal(whole, pieces)
    assert np.array_equal(np.diag(whole[:, ::-1]), rowwise)
    with np.errstate(invalid="ignore"):
        unit = raw / np.linalg.norm(raw.astype(np.float64), axis=1, keepdims=True)
    finite = np.isfinite(unit).all(axis=1)
    assert np.abs(whole[np.ix_(finite, finite)] - (unit[finite] @ unit[finite].T)).max() < 1e-3
    assert not whole[5].any() and not whole[6].any()


def test_vector_blobs_hold_the_exact_vectors_of_each_row_by_itself():
    """The shard steps read vectors fact_blocks rounded (`vector_blobs`), in DuckDB's chunks of
    rows: the floats they decode are exact_vectors' of the whole matrix, bit for bit, in any order."""
    rng = np.random.default_rng(11)
    raw = rng.standard_normal((5000, 64)).astype(np.float32) * rng.uniform(0.01, 100, (5000, 1)).astype(np.float32)
    raw[7] = 0
    raw[8, 2] = np.nan
    raw[9] = 1e-30  # underflows to a zero norm in float32
    column = pa.array(list(raw), pa.list_(pa.float32()))
    whole = exact_vectors(raw)
    chunks = pa.chunked_array([vector_blobs(column.slice(start, 2048)) for start in range(0, 5000, 2048)])
    assert chunks.type == pa.binary() and set(pc.binary_length(chunks).to_pylist()) == {128}
    assert np.array_equal(blob_vectors(chunks), whole)
    order = rng.permutation(5000)
    assert np.array_equal(blob_vectors(chunks, order), exact_vectors(raw, order))
    assert np.array_equal(blob_vectors(chunks.combine_chunks().slice(100, 50)), whole[100:150])  # an offset array


def test_vector_blobs_keep_nulls_and_other_widths_and_the_reader_refuses_them():
    mixed = pa.array([[3.0, 4.0], None, [1.0, 0.0, 0.0], [0.0, -2.0]], pa.list_(pa.float32()))
    blobs = vector_blobs(mixed)
    assert blobs.is_null().to_pylist() == [False, True, False, False]
    assert pc.binary_length(blobs).to_pylist() == [4, None, 6, 4]
    assert np.frombuffer(blobs[0].as_py(), "<i2").tolist() == [1229, 1638]  # 0.6 and 0.8 in 2048ths
    assert np.array_equal(blob_vectors(blobs.take([0, 3])), exact_vectors(np.array([[3, 4], [0, -2]], np.float32)))
    for wrong in (blobs, blobs.take([0, 2])):
        with pytest.raises(ValueError, match="no embedding or one of another size"):
            blob_vectors(wrong)


def test_ranks_and_pairs_are_the_same_from_vectors_as_from_embeddings():
    facts, links = random_graph(5)
    as_blobs = facts.append_column("vector", vector_blobs(facts.column("embedding"))).drop_columns(["embedding"])
    assert rank_candidates(as_blobs, links).equals(rank_candidates(facts, links))
    selected = rank_candidates(facts, links)
    assert pair_candidates(as_blobs, selected).equals(pair_candidates(facts, selected))
    assert pair_candidates(facts, selected).num_rows > 50


def test_identical_statements_tie_on_the_smaller_fact():
    """Two facts stated with the same words tie on cosine; with top_k=1 the smaller key wins,
    whatever the row order."""
    day = datetime(2018, 1, 1, tzinfo=timezone.utc)
    vector = np.ones(16, dtype=np.float32).tolist()
    rows = [("x", "DYNAMIC", day.replace(month=6), "k-new"), ("a", "DYNAMIC", day, "k-b"), ("b", "DYNAMIC", day, "k-a")]
    facts = pa.Table.from_pylist(
        [{"event_id": e, "temporal_type": t, "valid_at": v, "invalid_at": None, "embedding": vector, "fact_key": k} for e, t, v, k in rows],
        schema=pa.schema([("event_id", pa.string()), ("temporal_type", pa.string()), ("valid_at", pa.timestamp("us", tz="UTC")),
                          ("invalid_at", pa.timestamp("us", tz="UTC")), ("embedding", pa.list_(pa.float32())), ("fact_key", pa.string())]))
    links = pa.Table.from_pylist([{"event_id": e, "canonical_id": "org", "predicate_group": 1} for e, *_ in rows],
                                 schema=pa.schema([("event_id", pa.string()), ("canonical_id", pa.string()), ("predicate_group", pa.int8())]))
    for table in (facts, facts.take([2, 0, 1])):
        pairs = select_candidates(table, links, top_k=1)
        assert ("b", "x") in set(zip(pairs.column("primary_event_id").to_pylist(), pairs.column("secondary_event_id").to_pylist()))
        assert "a" not in pairs.column("primary_event_id").to_pylist()


def test_no_facts_or_links_give_no_pairs():
    facts, links = random_graph(1, events=20)
    assert select_candidates(facts.slice(0, 0), links).num_rows == 0
    assert select_candidates(facts, links.slice(0, 0)).num_rows == 0


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_the_pairs_of_some_units_need_only_their_rows_and_facts(seed):
    """A unit is two facts; the pairs whose events state them come from the selected rows that
    link an event of one to the other and from the events of the two alone (what lets
    judged_pairs pair again only the units whose rows or events changed): paired from just
    those, any set of units gets exactly its pairs of the whole shard's pairing."""
    facts, links = random_graph(seed, events=600, entities=8)
    ranks = rank_candidates(facts, links)
    with duckdb.connect() as connection:
        connection.register("ranks", ranks)
        selected = select_ranked(connection, "ranks").to_arrow_table().cast(ranks.schema)
    every_pair = pair_candidates(facts, selected)
    fact_of = dict(zip(facts.column("event_id").to_pylist(), facts.column("fact_key").to_pylist()))
    unit_of_row = [frozenset((fact_of[event], key)) for event, key in
                   zip(selected.column("incoming_event_id").to_pylist(), selected.column("fact_key").to_pylist())]
    units = sorted(set(unit_of_row), key=sorted)
    rng = random.Random(seed)
    for share in (0.1, 0.5):
        chosen = set(rng.sample(units, int(share * len(units))))
        keys = {key for unit in chosen for key in unit}
        some_facts = facts.filter(pc.is_in(facts.column("fact_key"), pa.array(sorted(keys))))
        some_rows = selected.filter(pa.array([unit in chosen for unit in unit_of_row]))
        expected = [row for row in every_pair.to_pylist()
                    if frozenset((fact_of[row["primary_event_id"]], fact_of[row["secondary_event_id"]])) in chosen]
        assert pair_candidates(some_facts, some_rows).to_pylist() == expected
        assert 0 < len(expected) < every_pair.num_rows
