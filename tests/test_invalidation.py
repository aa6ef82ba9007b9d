"""Invalidation: REFERENCE 1.8 rules, functional relations, and order independence."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import CORPUS, needs_corpus, offline_runtime
from tkg.build.graph import build_graph, finish_graph, partitions_of, run_partition
from tkg.core import tables
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.ingest.sources import SAMPLE_PATH, load_source
from tkg.invalidate.invalidation import facts_and_links, invalidate
from tkg.invalidate.judges import EventView, RuleJudge, TripletView
from tkg.store.parquet import ParquetStore


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def scenario(*facts):
    """facts: (event_id, statement, temporal_type, valid_at, invalid_at, (subject, predicate, object, value), created_at?)"""
    embedder = WordLlamaEmbedder()
    vectors = embedder.embed([f[1] for f in facts])
    events, triplets = [], []
    for (event_id, statement, temporal_type, valid_at, invalid_at, (subject, predicate, obj, value), *created), vector in zip(facts, vectors):
        created_at = day(created[0]) if created else day(valid_at)
        events.append({"event_id": event_id, "chunk_id": "c", "transcript_id": "t", "company": "X", "quarter": None,
                       "statement": statement, "statement_hash": event_id, "statement_type": "FACT", "temporal_type": temporal_type,
                       "valid_at": day(valid_at), "invalid_at": day(invalid_at) if invalid_at else None,
                       "created_at": created_at, "expired_at": None, "ingested_at": created_at, "embedding": vector.tolist()})
        triplets.append({"triplet_id": f"t{event_id}", "event_id": event_id, "company": "X", "quarter": None,
                         "subject_id": subject, "subject": subject, "subject_mention": subject, "predicate": predicate,
                         "object_id": obj, "object": obj, "object_mention": obj, "value": value})
    return tables.to_table(events, tables.EVENTS), pa.Table.from_pylist(triplets)


def outcome(events, triplets) -> dict[str, tuple]:
    result = invalidate(events, triplets, RuleJudge())
    return {r["event_id"]: (r["invalid_at"].date().isoformat(), r["invalidated_by"], r["expired_at"].date().isoformat())
            for r in result.event_invalidations.to_pylist()}


CFO = "CFO of Intel Corporation"


def test_new_holder_of_a_one_at_a_time_office_retires_the_old_one():
    events, triplets = scenario(
        ("smith1", "Stacy Smith is CFO of Intel Corporation.", "DYNAMIC", "2016-01-14", None, ("Stacy Smith", "HOLDS_ROLE", CFO, "CFO")),
        ("smith2", "Stacy Smith is CFO of Intel Corporation.", "DYNAMIC", "2016-07-20", None, ("Stacy Smith", "HOLDS_ROLE", CFO, "CFO")),
        ("swan1", "Robert H. Swan is CFO of Intel Corporation.", "DYNAMIC", "2016-10-18", None, ("Robert H. Swan", "HOLDS_ROLE", CFO, "CFO")),
        ("swan2", "Robert H. Swan is CFO of Intel Corporation.", "DYNAMIC", "2017-01-26", None, ("Robert H. Swan", "HOLDS_ROLE", CFO, "CFO")),
        ("swan_evp", "Robert H. Swan is EVP of Intel Corporation.", "DYNAMIC", "2017-01-26", None,
         ("Robert H. Swan", "HOLDS_ROLE", "EVP of Intel Corporation", "EVP")),
    )
    # both Smith statements end when Swan's first starts; the restated Swan and his second office stay open
    assert outcome(events, triplets) == {"smith1": ("2016-10-18", "swan1", "2016-10-18"), "smith2": ("2016-10-18", "swan1", "2016-10-18")}


def test_guidance_revision_and_restatement():
    g = "Helio FY2024 revenue guidance"
    events, triplets = scenario(
        ("g1", "Helio's FY2024 revenue guidance is $1.20 billion.", "DYNAMIC", "2024-02-06", None, ("Helio", "TARGETS", g, "$1.20 billion")),
        ("g2", "Helio's FY2024 revenue guidance is $1.20 billion.", "DYNAMIC", "2024-05-07", None, ("Helio", "TARGETS", g, "$1.20 billion")),
        ("g3", "Helio's FY2024 revenue guidance is $1.35 billion.", "DYNAMIC", "2024-08-06", None, ("Helio", "TARGETS", g, "$1.35 billion")),
        ("g4", "Helio's FY2024 revenue guidance is 12%.", "DYNAMIC", "2024-11-05", None, ("Helio", "TARGETS", g, "12%")),
    )
    assert outcome(events, triplets) == {"g1": ("2024-08-06", "g3", "2024-08-06"), "g2": ("2024-08-06", "g3", "2024-08-06")}


def test_contradiction_inside_one_transcript_counts():
    """One call says who was CFO until June and who is CFO now: same created_at, different valid_at."""
    events, triplets = scenario(
        ("old", "Dana Whitfield is CFO of Helio.", "DYNAMIC", "2024-02-06", None, ("Dana Whitfield", "HOLDS_ROLE", "CFO of Helio", "CFO"), "2024-08-06"),
        ("new", "Marcus Ortega became CFO of Helio on July 1, 2024.", "DYNAMIC", "2024-07-01", None,
         ("Marcus J. Ortega", "HOLDS_ROLE", "CFO of Helio", "CFO"), "2024-08-06"),
    )
    assert outcome(events, triplets) == {"old": ("2024-07-01", "new", "2024-08-06")}


def test_earliest_retirement_wins_and_finished_events_only_move_earlier():
    office = "CEO of Quantaris Networks Corporation"
    events, triplets = scenario(
        ("becker", "Thomas Becker is CEO of Quantaris Networks Corporation.", "DYNAMIC", "2024-01-30", "2024-12-31", ("Thomas Becker", "HOLDS_ROLE", office, "CEO")),
        ("vasquez", "Elena Vasquez is CEO of Quantaris Networks Corporation.", "DYNAMIC", "2024-10-01", None,
         ("Elena Vasquez", "HOLDS_ROLE", office, "CEO"), "2024-07-30"),
        ("interim", "Ann Lee is CEO of Quantaris Networks Corporation.", "DYNAMIC", "2024-11-15", None, ("Ann Lee", "HOLDS_ROLE", office, "CEO")),
        ("late", "Bo Chen is CEO of Quantaris Networks Corporation.", "DYNAMIC", "2025-02-01", None, ("Bo Chen", "HOLDS_ROLE", office, "CEO")),
    )
    result = outcome(events, triplets)
    # Becker's end moves earlier, to Vasquez's start; known since the 2024-07-30 call that announced her
    assert result["becker"] == ("2024-10-01", "vasquez", "2024-07-30")
    assert result["vasquez"] == ("2024-11-15", "interim", "2024-11-15")
    assert result["interim"] == ("2025-02-01", "late", "2025-02-01")
    assert "late" not in result


def relabelled(events: pa.Table, event_id: str, **labels: str) -> pa.Table:
    """`events` with one event's statement_type and/or temporal_type changed, all else kept."""
    rows = events.to_pylist()
    for row in rows:
        if row["event_id"] == event_id:
            row.update(labels)
    return tables.to_table(rows, tables.EVENTS)


# Intel's Q3 2016 revenue as first reported, then restated a call later: as DYNAMIC FACTs the
# restatement retires the first figure (one value per metric and period).
Q3_REVENUE = (
    ("q3", "Intel revenue for Q3 2016 was $15.8 billion.", "DYNAMIC", "2016-10-18", None,
     ("Intel", "HAS_REVENUE", "Intel revenue Q3 2016", "$15.8 billion")),
    ("q3_restated", "Intel revenue for Q3 2016 was $15.9 billion.", "DYNAMIC", "2017-01-26", None,
     ("Intel", "HAS_REVENUE", "Intel revenue Q3 2016", "$15.9 billion")),
)


@pytest.mark.parametrize("labels", [{"temporal_type": "STATIC"}, {"statement_type": "OPINION"}], ids=lambda labels: next(iter(labels.values())))
def test_static_and_opinion_events_are_never_retired(labels):
    events, triplets = scenario(*Q3_REVENUE)
    assert outcome(events, triplets) == {"q3": ("2017-01-26", "q3_restated", "2017-01-26")}
    assert outcome(relabelled(events, "q3", **labels), triplets) == {}


# Stacy Smith's CFO office passing to Robert Swan: as DYNAMIC FACTs, Swan's statement retires Smith's.
CFO_CHANGE = (
    ("smith", "Stacy Smith is CFO of Intel Corporation.", "DYNAMIC", "2016-01-14", None, ("Stacy Smith", "HOLDS_ROLE", CFO, "CFO")),
    ("swan", "Robert H. Swan is CFO of Intel Corporation.", "DYNAMIC", "2016-10-18", None, ("Robert H. Swan", "HOLDS_ROLE", CFO, "CFO")),
)


@pytest.mark.parametrize("event_id", ["smith", "swan"], ids=["as_the_older_event", "as_the_newer_event"])
@pytest.mark.parametrize("labels", [{"statement_type": "OPINION"}, {"statement_type": "PREDICTION"}, {"temporal_type": "ATEMPORAL"}],
                         ids=lambda labels: next(iter(labels.values())))
def test_opinions_predictions_and_atemporal_statements_take_no_part_in_invalidation(labels, event_id):
    """REFERENCE 1.8: only FACTs retire and get retired, and an ATEMPORAL statement never stops
    being true. The same pair that retires as DYNAMIC FACTs retires nothing once either event
    carries an excluded label, and is not even put to the judge (whose rules would retire it)."""
    events, triplets = scenario(*CFO_CHANGE)
    assert outcome(events, triplets) == {"smith": ("2016-10-18", "swan", "2016-10-18")}
    result = invalidate(relabelled(events, event_id, **labels), triplets, RuleJudge())
    assert result.event_invalidations.num_rows == 0
    assert result.judgments.num_rows == 0 and result.counts["fact_events"] == 1


def test_every_judgment_is_kept_with_its_reason():
    events, triplets = scenario(
        ("a", "Stacy Smith is CFO of Intel Corporation.", "DYNAMIC", "2016-01-14", None, ("Stacy Smith", "HOLDS_ROLE", CFO, "CFO")),
        ("b", "Stacy Smith is CFO of Intel Corporation.", "DYNAMIC", "2016-04-19", None, ("Stacy Smith", "HOLDS_ROLE", CFO, "CFO")),
    )
    judgments = invalidate(events, triplets, RuleJudge()).judgments.to_pylist()
    assert [(j["primary_event_id"], j["secondary_event_id"], j["invalidates"]) for j in judgments] == [("a", "b", False)]
    assert "compatible" in judgments[0]["reason"] and judgments[0]["judge"] == RuleJudge.name


# --- order independence on real builds ------------------------------------------------------


def _history(home) -> list[tuple]:
    store = ParquetStore(home)
    rows = store.read(store.global_path("invalidated_events", "event_invalidations")).to_pylist()
    return sorted((r["event_id"], r["invalid_at"], r["invalidated_by"], r["expired_at"]) for r in rows)


def _build_in_order(home, source, partitions):
    runtime = offline_runtime(home)
    for partition in partitions:
        run_partition(runtime, partition, source)
        # global stages after every partition, as automation does when partitions land one by one
        finish_graph(runtime)
    return _history(home)


def test_sample_history_does_not_depend_on_partition_order(tmp_path):
    source = load_source("sample")
    partitions = partitions_of(source)
    shuffled = partitions[:]
    random.Random(7).shuffle(shuffled)
    in_date_order = _build_in_order(tmp_path / "forward", source, partitions)
    assert len(in_date_order) >= 8
    assert _build_in_order(tmp_path / "reverse", source, list(reversed(partitions))) == in_date_order
    assert _build_in_order(tmp_path / "shuffled", source, shuffled) == in_date_order


@needs_corpus
def test_real_history_does_not_depend_on_partition_order(tmp_path):
    """INTC 2016-2017 (Stacy Smith's CFO office passing to Robert Swan): date order, reverse, and a
    missed call added last."""
    from datetime import date

    source = load_source(str(CORPUS))
    partitions = partitions_of(source, {"INTC"}, date(2016, 1, 1), date(2017, 12, 31))
    missed_last = [p for p in partitions if p != ("INTC", date(2017, 1, 1))] + [("INTC", date(2017, 1, 1))]
    histories = []
    for name, order in (("forward", partitions), ("reverse", partitions[::-1]), ("missed_last", missed_last)):
        runtime = offline_runtime(tmp_path / name)
        for partition in order:
            run_partition(runtime, partition, source)
        finish_graph(runtime)
        histories.append(_history(tmp_path / name))
    assert histories[0] and histories[1] == histories[0] and histories[2] == histories[0]


def test_reingesting_a_partition_reopens_what_only_it_retired(tmp_path):
    """Re-ingest Helio's two later calls from a corrected source in which the CFO never changed:
    Dana Whitfield's CFO facts, retired only by Marcus Ortega's, are open again."""
    source = load_source("sample")
    runtime = offline_runtime(tmp_path / "home")
    store = runtime.store
    build_graph(runtime, source, partitions_of(source))
    whitfield = lambda: {(r["invalid_at"] is None) for r in _cfo_rows(store, "Dana Whitfield")}
    assert whitfield() == {False}

    corrected = tmp_path / "corrected.jsonl"
    lines = []
    for line in SAMPLE_PATH.read_text().splitlines():
        row = json.loads(line)
        if row["company"] == "HLIO" and row["date"] >= "2024-08-01":
            row["transcript"] = (row["transcript"].replace("Marcus J. Ortega", "Dana Whitfield").replace("Marcus Ortega", "Dana Whitfield")
                                 .replace("Marc Ortega", "Dana Whitfield").replace("joined Helio as CFO", "remains CFO"))
        lines.append(json.dumps(row))
    corrected.write_text("\n".join(lines) + "\n")
    corrected_source = load_source(str(corrected))
    for partition in partitions_of(corrected_source, {"HLIO"}):
        if partition[1].month >= 7:
            run_partition(runtime, partition, corrected_source)
    finish_graph(runtime)
    assert whitfield() == {True}


def _cfo_rows(store, person):
    events = store.read_all("temporal_events", tables.EVENTS).to_pylist()
    invalidations = {r["event_id"]: r for r in store.read(store.global_path("invalidated_events", "event_invalidations")).to_pylist()}
    rows = []
    for event in events:
        if event["statement"].startswith(f"{person} is CFO"):
            rows.append({"event_id": event["event_id"], "invalid_at": (invalidations.get(event["event_id"]) or {}).get("invalid_at", event["invalid_at"])})
    assert rows, person
    return rows


def test_a_facts_key_is_its_canonical_triplets_in_order_whatever_order_they_come_in():
    """An event of one triplet has that triplet's text as its key; an event of several has them
    sorted (subject, predicate, object id with the unresolved last, value with none last), so
    two events stating the same triplets in any order have one key, and one of them alone
    (another fact) has another."""
    triplets = [("Intel", "HOLDS_ROLE", "cfo", "CFO"), ("Intel", "REPORTED", None, "$1B"), ("Intel", "REPORTED", None, None),
                ("AMD", "GUIDED", "rev", "3%"), ("Intel", "HOLDS_ROLE", "ceo", None)]
    events, rows = scenario(*[(event_id, f"Statement {event_id}.", "DYNAMIC", "2017-01-26", None, triplets[0])
                              for event_id in ("one", "many", "shuffled")])
    rows = rows.filter(pc.equal(rows.column("event_id"), "one")).to_pylist()
    for event_id, order in (("many", [1, 4, 0, 3, 2]), ("shuffled", [2, 0, 3, 4, 1])):
        for number in order:
            subject, predicate, obj, value = triplets[number]
            rows.append({"triplet_id": f"{event_id}{number}", "event_id": event_id, "company": "X", "quarter": None,
                         "subject_id": subject, "subject": subject, "subject_mention": subject, "predicate": predicate,
                         "object_id": obj, "object": obj or "an amount", "object_mention": obj, "value": value})
    facts, _ = facts_and_links(events, pa.Table.from_pylist(rows))
    keys = dict(zip(facts.column("event_id").to_pylist(), facts.column("fact_key").to_pylist()))

    def text(subject, predicate, obj, value):
        return "|".join(part for part in (subject, predicate, obj or "an amount", value) if part is not None)

    in_order = sorted(triplets, key=lambda t: (t[0], t[1], t[2] is None, t[2] or "", t[3] is None, t[3] or ""))
    assert keys == {"one": text(*triplets[0]), "many": ";".join(text(*t) for t in in_order),
                    "shuffled": ";".join(text(*t) for t in in_order)}


def test_the_rule_judge_gives_the_same_verdicts_on_a_table_of_pairs_as_case_by_case():
    """`RuleJudge.judge_table` (what the graph's build uses) against `judge` on random events
    that hit every rule: offices held one at a time or not, a holder restated, figures revised,
    restated or measuring other things, objects with no id, missing or equal start times, and
    events with several triplets, where the first that decides counts."""
    rng = random.Random(7)
    kinds = {"HOLDS_ROLE": ["CFO of Helio", "EVP of Helio", "Chairman", ""],  # predicate: its objects
             "TARGETS": ["FY2024 revenue guidance", "FY2024 revenue guidance", None], "IS_A": ["company"]}
    values = ["$1.20 billion", "$1.2 billion", "$1.35 billion", "12%", "12 percent", "50 basis points", None]
    starts = [None, day("2020-01-01"), day("2020-04-01"), day("2020-07-01"), day("2020-10-01")]
    facts, triplets, views = [], [], {}
    for number in range(100):
        event_id, valid_at = f"e{number:02d}", rng.choice(starts)
        facts.append({"event_id": event_id, "valid_at": valid_at})
        chosen = []
        for _ in range(rng.choice([0, 1, 2, 3, 4])):
            subject, predicate = rng.choice(["p1", "p2", None]), rng.choice(list(kinds))
            obj = rng.choice(kinds[predicate])
            chosen.append(TripletView(subject=(subject or "someone").upper(), subject_id=subject, predicate=predicate,
                                      object=obj or "unnamed", object_id=obj, value=rng.choice(values)))
        triplets += [{"event_id": event_id, **vars(view)} for view in chosen]
        views[event_id] = EventView(event_id, "s", "FACT", "DYNAMIC", valid_at, None, day("2020-01-01"), tuple(chosen))
    rng.shuffle(triplets)  # the table's order is the order the rules are tried in, whatever it is
    in_table_order = {event_id: tuple(TripletView(**{k: v for k, v in row.items() if k != "event_id"})
                                      for row in triplets if row["event_id"] == event_id) for event_id in views}
    pairs = [(a, b) for a in views for b in views if a != b and rng.random() < 0.5]
    judge = RuleJudge()
    expected = [judge._verdict(replace(views[a], triplets=in_table_order[a]), replace(views[b], triplets=in_table_order[b]))
                for a, b in pairs]
    invalidates, reasons = judge.judge_table(
        pa.table({"primary_event_id": [a for a, _ in pairs], "secondary_event_id": [b for _, b in pairs]}),
        pa.Table.from_pylist(facts, pa.schema([("event_id", pa.string()), ("valid_at", pa.timestamp("us", tz="UTC"))])),
        pa.Table.from_pylist(triplets))
    assert list(zip(invalidates.to_pylist(), reasons.to_pylist())) == [(v.invalidates, v.reason) for v in expected]
    rules = Counter(re.sub(r"^(?:.* )?(holds|restated as|revised from|restated at|measure different|no functional|"
                           r"does not start).*", r"\1", reason) for reason in reasons.to_pylist())
    assert len(rules) == 7 and min(rules.values()) >= 3, rules  # every rule had its say
