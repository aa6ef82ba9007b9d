"""Candidate selection against a plain, event-by-event reading of REFERENCE 1.8 on random data."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from tkg.candidates import select_candidates

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
    """REFERENCE 1.8 read literally, one incoming event at a time."""
    rows = {r["event_id"]: r for r in facts.to_pylist()}
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
            cosine = float(np.dot(x["embedding"], c["embedding"]))
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
    return pairs


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
