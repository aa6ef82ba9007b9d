"""Entity resolution: the traps of the seed's fuzzy matching, and stable canonical ids."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tkg.core import tables
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.resolve.resolution import resolve_entities

T0 = datetime(2016, 1, 1, tzinfo=timezone.utc)


def mentions(*items, start: int = 0, descriptions: dict[str, str] | None = None, embed: bool = False) -> pa.Table:
    """(type, name) pairs -> an entity-mentions table; one mention per item, a day apart."""
    rows = []
    for offset, (entity_type, name) in enumerate(items):
        rows.append({"entity_id": f"m{start + offset}", "event_id": f"e{start + offset}", "company": "X", "quarter": None,
                     "name": name, "type": entity_type, "description": (descriptions or {}).get(name, ""),
                     "seen_at": T0 + timedelta(days=start + offset), "embedding": None})
    if embed:
        vectors = WordLlamaEmbedder().embed([f"{r['name']}: {r['description']}" for r in rows])
        for row, vector in zip(rows, vectors):
            row["embedding"] = vector.tolist()
    return tables.to_table(rows, tables.ENTITIES)


def clusters(resolution) -> dict[str, str]:
    """name -> canonical id."""
    by_id = dict(zip(resolution.mapping.column("entity_id").to_pylist(), resolution.mapping.column("canonical_id").to_pylist()))
    return by_id


def same(table, resolution, a: str, b: str) -> bool:
    names = dict(zip(table.column("name").to_pylist(), table.column("entity_id").to_pylist()))
    mapping = clusters(resolution)
    return mapping[names[a]] == mapping[names[b]]


@pytest.mark.parametrize("a, b", [
    ("Bob Swan", "Robert H. Swan"), ("Robert Swan", "Robert H. Swan"), ("Chuck Robbins", "Charles H. Robbins"),
    ("R.J.M. Dassen", "Roger J. M. Dassen"), ("R. J. M. Dassen", "Roger J. M. Dassen"), ("Ernie Maddock", "Ernest E. Maddock"),
    ("Lisa Su", "Lisa T. Su"), ("Colette Kress", "Colette M. Kress"), ("Tim Cook", "Timothy D. Cook"),
    ("Jen-Hsun Huang", "Jensen Hsun Huang"), ("Jensen Huang", "Jen-Hsun Huang"), ("Peter Wennink", "Peter T. F. M. Wennink"),
])
def test_people_with_nicknames_and_initials_merge(a, b):
    table = mentions(("Person", a), ("Person", b))
    assert same(table, resolve_entities(table), a, b)


@pytest.mark.parametrize("a, b", [
    ("Stacy Smith", "Stacy Rasgon"), ("Dana Whitfield", "Dana Kowalski"), ("Robert H. Swan", "Robert J. Swan"),
    ("Stacy Smith", "Robert H. Swan"), ("Brian Krzanich", "Brian Olsavsky"), ("Mark Durcan", "Mark Henninger"),
])
def test_people_sharing_only_a_first_name_stay_apart(a, b):
    table = mentions(("Person", a), ("Person", b))
    assert not same(table, resolve_entities(table), a, b)


def test_a_name_matching_two_people_does_not_chain_them():
    table = mentions(("Person", "Robert Swan"), ("Person", "Rebecca Swan"), ("Person", "R. Swan"))
    resolution = resolve_entities(table)
    assert not same(table, resolution, "Robert Swan", "Rebecca Swan")


@pytest.mark.parametrize("a, b, expected", [
    ("Micron", "Microsoft", False), ("Apple", "Applied Materials", False), ("Micron Technology", "Microsoft Corp", False),
    ("AMD", "Advanced Micro Devices, Inc.", True), ("Advanced Micro Devices", "AMD", True), ("Intel Corp", "Intel Corporation", True),
    ("Micron", "Micron Technology, Inc.", True), ("Google Inc.", "Google LLC", True), ("Google LLC", "Alphabet Inc.", False),
    ("Acme Widgets", "Acme Widgets Technologies", True), ("Acme", "Acme Cloud", False),
])
def test_organisations(a, b, expected):
    table = mentions(("Organization", a), ("Organization", b))
    assert same(table, resolve_entities(table), a, b) is expected


def test_registry_seeds_company_canonicals():
    table = mentions(("Organization", "AMD"), ("Organization", "Advanced Micro Devices, Inc."), ("Organization", "Intel Corp"))
    resolution = resolve_entities(table)
    names = {r["canonical_id"]: r["name"] for r in resolution.canonical_entities.to_pylist()}
    mapped = set(clusters(resolution).values())
    assert {"cmp_AMD", "cmp_INTC"} == mapped
    assert names["cmp_AMD"] == "Advanced Micro Devices, Inc."


def test_offices_and_metrics_match_exactly():
    table = mentions(("Role", "CFO of Intel Corp"), ("Role", "CFO of Intel Corporation"), ("Role", "CEO of Intel Corporation"),
                     ("Metric", "Intel revenue Q3 2016"), ("Metric", "Intel revenue Q4 2016"))
    resolution = resolve_entities(table)
    assert same(table, resolution, "CFO of Intel Corp", "CFO of Intel Corporation")
    assert not same(table, resolution, "CFO of Intel Corporation", "CEO of Intel Corporation")
    assert not same(table, resolution, "Intel revenue Q3 2016", "Intel revenue Q4 2016")


HELIOS = (("Organization", "Helios"), ("Organization", "Helios Robot"))
ORION = (("Organization", "Orion"), ("Organization", "Orion Cloud"))


def test_description_embeddings_settle_ambiguous_extensions():
    """'Helios Robot' extends 'Helios' with a word that is not a generic corporate one, so the
    names alone leave it open: descriptions that say the same thing merge the two, and
    descriptions that do not ('Orion' the satellite, 'Orion Cloud' the storage service) keep
    them apart."""
    descriptions = {"Helios": "Helio Robotics' warehouse robot line", "Helios Robot": "Warehouse robot line sold by Helio Robotics",
                    "Orion": "A satellite launched by a space agency", "Orion Cloud": "A cloud storage service for banks"}
    table = mentions(*HELIOS, *ORION, descriptions=descriptions, embed=True)
    resolution = resolve_entities(table)
    assert same(table, resolution, "Helios", "Helios Robot")
    assert not same(table, resolution, "Orion", "Orion Cloud")


@pytest.mark.parametrize("descriptions, embed", [
    ({"Helios": "Helio Robotics' warehouse robot line", "Helios Robot": "Warehouse robot line sold by Helio Robotics"}, False),
    ({"Helios": "Helio Robotics' warehouse robot line", "Helios Robot": "A cloud storage service for banks"}, True),
    # what the offline extractor says of every organisation: close embeddings that say nothing
    ({"Helios": "Organisation named in an earnings call", "Helios Robot": "Organisation named in an earnings call"}, True),
], ids=["no_embeddings", "descriptions_disagree", "same_boilerplate"])
def test_the_names_alone_do_not_merge_an_ambiguous_extension(descriptions, embed):
    """The merge above is the descriptions' doing: without embeddings, with descriptions that
    disagree, or with one boilerplate description on both, the same names stay apart."""
    table = mentions(*HELIOS, descriptions=descriptions, embed=embed)
    assert not same(table, resolve_entities(table), "Helios", "Helios Robot")


def _live(resolution) -> dict[str, str]:
    """canonical id -> name of the entities mentions resolve to."""
    return {r["canonical_id"]: r["name"] for r in resolution.canonical_entities.to_pylist() if r["mention_count"]}


def test_canonical_ids_are_stable_as_partitions_arrive():
    first = mentions(("Person", "Bob Swan"), ("Organization", "Acme Widgets"))
    before = resolve_entities(first)
    # a later partition brings the full names: the ids stay, the names become the fuller ones
    later = mentions(("Person", "Bob Swan"), ("Organization", "Acme Widgets"), ("Person", "Robert H. Swan"),
                     ("Organization", "Acme Widgets Inc."))
    after = resolve_entities(later, before.canonical_entities)
    assert set(_live(after)) == set(_live(before))
    assert set(_live(after).values()) == {"Robert H. Swan", "Acme Widgets Inc."}
    assert set(clusters(after).values()) == set(_live(before))


def test_entities_do_not_depend_on_build_history():
    # Built as a base and then one more call, or all at once: the same entities, names and
    # ids, mention for mention (issue 10: 'Vijay Rakesh' against 'Vijay Raghavan Rakesh').
    base = mentions(("Person", "Vijay Rakesh"), ("Organization", "Mizuho"))
    everything = mentions(("Person", "Vijay Rakesh"), ("Organization", "Mizuho"), ("Person", "Vijay Raghavan Rakesh"),
                          ("Organization", "Mizuho Securities"))
    incremental = resolve_entities(everything, resolve_entities(base).canonical_entities)
    at_once = resolve_entities(everything)
    assert incremental.mapping.equals(at_once.mapping)
    assert _live(incremental) == _live(at_once)
    assert "Vijay Raghavan Rakesh" in _live(at_once).values()


def test_retired_ids_are_kept_and_point_at_their_entity():
    # A registry from an older, narrower matcher holds 'Robert H. Swan' and 'Bob Swan' apart.
    def canonical(canonical_id, name, first_seen):
        return {"canonical_id": canonical_id, "name": name, "type": "Person", "description": "", "aliases": [name],
                "mention_count": 1, "first_seen": first_seen, "last_seen": first_seen, "merged_into": None, "source": "mentions"}
    registry = tables.to_table([canonical("ent_old_robert", "Robert H. Swan", T0),
                                canonical("ent_old_bob", "Bob Swan", T0 + timedelta(days=90))], tables.CANONICAL_ENTITIES)
    joined = resolve_entities(mentions(("Person", "Robert H. Swan"), ("Person", "Bob Swan")), registry)
    rows = {r["canonical_id"]: r for r in joined.canonical_entities.to_pylist()}
    (live_id,) = set(clusters(joined).values())
    assert rows[live_id]["name"] == "Robert H. Swan"
    # both old ids are kept, with no mentions, and lead to the entity that holds their names
    assert rows["ent_old_robert"]["merged_into"] == live_id and rows["ent_old_bob"]["merged_into"] == live_id
    assert rows["ent_old_bob"]["mention_count"] == 0 and joined.counts["retired_ids_kept"] == 2


def test_grouping_does_not_depend_on_row_order():
    items = [("Person", n) for n in ("Bob Swan", "Robert H. Swan", "Stacy Smith", "Stacy Rasgon", "R. Swan", "Rebecca Swan")]
    items += [("Organization", n) for n in ("Micron", "Microsoft", "Micron Technology", "AMD", "Advanced Micro Devices")]
    forward, backward = mentions(*items), mentions(*reversed(items))
    def groups(table):
        mapping = clusters(resolve_entities(table))
        by_name = dict(zip(table.column("entity_id").to_pylist(), table.column("name").to_pylist()))
        grouped: dict[str, set] = {}
        for entity_id, canonical in mapping.items():
            grouped.setdefault(canonical, set()).add(by_name[entity_id])
        return sorted(map(sorted, grouped.values()))
    assert groups(forward) == groups(backward)


def test_a_ticker_and_the_legal_name_are_one_company():
    table = mentions(("Organization", "Intel Corporation"), ("Organization", "INTC"), ("Organization", "Intel Corp."),
                     ("Organization", "Intel Inc."))
    assert set(clusters(resolve_entities(table)).values()) == {"cmp_INTC"}


def test_an_all_initials_form_does_not_split_a_nickname_off():
    table = mentions(("Person", "Robert H. Swan"), ("Person", "R.H. Swan"), ("Person", "Bob Swan"))
    assert len(set(clusters(resolve_entities(table)).values())) == 1


@pytest.mark.parametrize("entity_type, a, b, expected", [
    ("Role", "Chief Financial Officer of Intel Corporation", "CFO of Intel Corp", True),
    ("Role", "Chief Executive Officer of Intel Corporation", "CFO of Intel Corporation", False),
    ("Metric", "Intel Corporation revenue Q3 2016", "Intel revenue Q3 2016", True),
    ("Metric", "revenue Q3 2016 Intel", "Intel revenue Q3 2016", True),
    ("Metric", "AMD revenue Q3 2016", "Intel revenue Q3 2016", False),
    ("Numeric", "$15.8B", "$15.8 billion", True),
    ("Numeric", "15.8 billion dollars", "$15.8 billion", True),
    ("Numeric", "10%", "10 percent", True),
    ("Numeric", "10%", "100%", False),
    ("Numeric", "$10 million", "10%", False),
    ("Product", "Intel Xeon", "Xeon", True),
    ("Product", "iPhone 7", "iPhone 8", False),
])
def test_typed_keys(entity_type, a, b, expected):
    table = mentions((entity_type, a), (entity_type, b))
    assert same(table, resolve_entities(table), a, b) is expected


def _participants_from_corpus() -> list:
    from tests.conftest import CORPUS
    from tkg.core.companies import get_company
    from tkg.ingest.parsing import parse_transcript
    from tkg.ingest.sources import load_source

    if not CORPUS.exists():
        return []
    return [p for row in load_source(str(CORPUS)).rows for p in parse_transcript(row, get_company(row.company)).participants]


def _names_from_corpus() -> list[str]:
    return sorted({p.name.strip() for p in _participants_from_corpus() if p.name.strip()})


TRICKY_NAMES = ["Lisa T. Su", "Dr. Lisa Su", "Lisa Su, Ph.D.", "Mark Van Dyke", "Mark May", "Dean Smith", "Chief Smith",
                "John Smith Jr.", "Jen-Hsun Huang", "Maria de la Cruz", "R.J.M. Dassen", "Peter T. F. M. Wennink",
                "Smith, John", "Sir John Smith", "Bob and Alice Smith", "Ann Marie Smith", "S.T. Sacconaghi",
                "Kyle P. McNealy", "C.J. Muse", "A. M. Sacconaghi", "Mary MacDonald", "Dr. J.T. Kirk", "J.P. Morgan Jr.",
                "Dave O'Connor", "Ernest C. O'Connor", "Anthony Joseph DiClemente", "Kai S. DeYoung", "Ross Stuart MacMillan",
                "Jean D'Arcy", "Mary O'Neil-Smith", "John DeLa Cruz", "Amy McD", "Tom O'", "Joe DiClemente III"]


def test_person_names_split_as_nameparser_splits_them():
    """The fast path for plain names gives exactly nameparser's first/middle/last, on tricky names
    and on every participant of the real corpus (when present)."""
    import re

    from nameparser import HumanName

    from tkg.core.names import fold
    from tkg.resolve.resolution import _name_parts

    def tokens(given_and_last):
        given, last = given_and_last
        return tuple(fold(t) for t in re.split(r"[\s.\-]+", given) if fold(t)), fold(last)

    names = TRICKY_NAMES + _names_from_corpus()
    for name in names:
        parsed = HumanName(name)
        assert tokens(_name_parts(name)) == tokens((f"{parsed.first} {parsed.middle}", parsed.last)), name


def _key_test_names() -> list[str]:
    """Metric- and amount-like names: registry names in every position and spelling, periods,
    scales and units, punctuation, non-ASCII and control characters."""
    from tkg.core.companies import load_companies

    companies = [name for c in load_companies().values() for name in (c.name, c.ticker, *c.aliases)]
    metrics = [f"{company} {metric} {period}" for company in companies
               for metric in ("revenue", "gross margin guidance", "data-center revenue (GAAP)")
               for period in ("Q3 2016", "FY2019", "")]
    metrics += [f"{period} {metric} of {company}" for company in companies[:5] for metric in ("revenue",) for period in ("Q1 2017",)]
    metrics += ["Intel Intel Corporation revenue", "advanced micro devices inc gross margin", "AMD AMD", "Intelligence revenue",
                "Apple Apple Inc. iPhone units", "Intel-Corp revenue", "Micron Technology Micron", "", "  ", "revenue   Q3",
                "Crédit Suisse revenue", "Ümsatz Q3", "x\tY revenue", "revenue\x1cQ3", "ＡＭＤ revenue", "İntel revenue"]
    amounts = ["$15.8B", "$ 15.8 billion", "15.8 billion dollars", "15.8 Billion USD", "USD 3,400.5 mn", "us$3k", "10%",
               "10 percent", "10 per cent", ".5%", "1,2,3", "3.5 M.", "  $4 ", "3 T", "0.1234567 billion", "12345678901",
               "about $4 billion", "Revenue 2019", "€5 million", "5\u00a0million", "٣ million", "3 \u212a", "$", "1e6"]
    return metrics + amounts


def test_batched_keys_equal_the_one_name_keys():
    """folds/metric_keys/numeric_keys (polars, printable ASCII) give exactly fold/metric_key/numeric_key."""
    from tkg.core.names import fold
    from tkg.resolve.resolution import (
        folds,
        metric_key,
        metric_keys,
        numeric_key,
        numeric_keys,
    )

    names = _key_test_names() + TRICKY_NAMES + ["Crédit  Suisse,", "Ørsted A/S", "the_thing", "a\u00a0b", "ǅemal", "ΟΔΟΣ"]
    assert folds(names) == [fold(n) for n in names]
    assert metric_keys(names) == [metric_key(n) for n in names]
    assert numeric_keys(names) == [numeric_key(n) for n in names]
    assert metric_keys([]) == [] and numeric_keys([]) == []


def test_legal_suffixes_stripped_exactly_as_cleanco_does():
    """tkg.core.names.basename passes cleanco only the terms that can match: same result as cleanco's
    own basename, on tricky names and every participant's firm in the real corpus (when present)."""
    import cleanco

    from tkg.core.names import basename

    firms = {p.organization for p in _participants_from_corpus() if p.organization}
    names = sorted(firms) + ["Foo Co Ltd", "ASML Holding N.V.", "Acme, Inc.", "Société Générale S.A.", "X GmbH & Co. KG", "Ltd",
                             "", " ", "Co.", "Taiwan Semiconductor Manufacturing Company Limited", "The Home Depot, Inc.",
                             "Ltd. Ltd.", "Inc Inc Inc", "Morgan Stanley, Research Division", "Credit Suisse AG", "Ørsted A/S",
                             "B. Riley & Co., LLC", "Sanford C. Bernstein & Co., LLC.", "Nomura Securities Co. Ltd."]
    assert [basename(n) for n in names] == [cleanco.basename(n) for n in names]


def test_no_mentions_and_blank_names_leave_only_the_registry():
    from tkg.core.companies import load_companies

    blank = tables.to_table([{"entity_id": "m1", "event_id": "e1", "company": "X", "quarter": None, "name": "   ", "type": None,
                              "description": None, "seen_at": None, "embedding": None}], tables.ENTITIES)
    for table in (tables.ENTITIES.empty_table(), blank):
        resolution = resolve_entities(table)
        assert resolution.mapping.num_rows == 0
        assert sorted(resolution.canonical_entities.column("source").to_pylist()) == ["registry"] * len(load_companies())
        assert resolution.counts["canonical_entities"] == len(load_companies())


def test_names_that_fold_alike_but_stay_apart_get_distinct_canonicals():
    """'SU', 'Su' and 'su' are single words, so they are not merged as people; they fold alike,
    so their ids collide and the later ones are split off, each to an unused id."""
    table = mentions(("Person", "SU"), ("Person", "Su"), ("Person", "su"))
    resolution = resolve_entities(table)
    canonicals = {r["canonical_id"]: r for r in resolution.canonical_entities.to_pylist() if r["source"] == "mentions"}
    assert len(canonicals) == 3 == len(set(clusters(resolution).values()))
    assert sorted(alias for r in canonicals.values() for alias in r["aliases"]) == ["SU", "Su", "su"]
    assert resolution.counts["clusters_split"] == 2


def test_an_unrelated_longer_embedding_does_not_change_organisations():
    """Two organisations' description embeddings are compared with each other alone: a mention
    of another type, or another organisation, with a longer embedding (another embedder's)
    changes nothing; an organisation whose only embedding is of another length has no evidence
    against them."""
    def table(*extra):
        rows = [("Organization", "Acme", "maker", [1.0, 0.0, 0.0, 0.0]), ("Organization", "Acme Cloud", "cloud unit", [1.0, 0.0, 0.0, 0.0]),
                *extra]
        return tables.to_table([{"entity_id": f"m{i}", "event_id": "e", "company": "X", "quarter": None, "name": name, "type": kind,
                                 "description": description, "seen_at": T0, "embedding": vector}
                                for i, (kind, name, description, vector) in enumerate(rows)], tables.ENTITIES)
    alone, with_person = table(), table(("Person", "Lisa Su", None, [1.0] * 8))
    assert same(alone, resolve_entities(alone), "Acme", "Acme Cloud")
    assert same(with_person, resolve_entities(with_person), "Acme", "Acme Cloud")
    with_organisation = table(("Organization", "Zenith", "maker", [1.0] + [0.0] * 7),
                              ("Organization", "Zenith Labs", "research lab", [1.0] + [0.0] * 7))
    resolution = resolve_entities(with_organisation)
    assert same(with_organisation, resolution, "Acme", "Acme Cloud") and same(with_organisation, resolution, "Zenith", "Zenith Labs")
    other_length = table(("Organization", "Acme Cloud", "cloud unit", [1.0] * 8))  # its evidence: the longer one
    assert not same(other_length, resolve_entities(other_length), "Acme", "Acme Cloud")


def test_mapping_does_not_depend_on_row_order_even_with_a_repeated_id():
    table = mentions(("Product", "Zeta"), ("Product", "Alpha"), ("Organization", "Intel Corp."), ("Person", "Bob Swan"))
    table = table.set_column(0, "entity_id", pa.array(["m0", "m0", "m1", "m2"]))
    mapping = resolve_entities(table).mapping
    assert mapping.num_rows == 4 and len(set(mapping.column("canonical_id").to_pylist())) == 4
    for order in ([3, 2, 1, 0], [1, 3, 0, 2]):
        assert resolve_entities(table.take(order)).mapping.equals(mapping)


def test_mentions_read_from_the_store_resolve_as_they_do_in_memory(tmp_path, monkeypatch):
    """The global step reads mentions from the partition files a column at a time (DuckDB, out
    of core): the same entities and mapping as the mentions in memory, read in mention order
    (company, quarter, entity id), descriptions and embedding evidence included; and the same
    again with the names read from the store's packs."""
    from datetime import date

    import duckdb

    from tkg.core.versions import Stamp, stamped
    from tkg.resolve.resolution import MentionSource
    from tkg.store import packs
    from tkg.store.manifest import stamped_files
    from tkg.store.parquet import ParquetStore

    table = mentions(("Organization", "Micron"), ("Organization", "Micron Memory"), ("Person", "Bob Swan"),
                     ("Person", "Robert H. Swan"), ("Organization", "Micron Technology"), ("Metric", "revenue"),
                     descriptions={"Micron": "memory maker", "Micron Memory": "a memory chip company"}, embed=True)
    store = ParquetStore(tmp_path)
    rows = table.to_pylist()
    partitions = [("AMD", date(2017, 1, 1)), ("AMD", date(2016, 10, 1)), ("INTC", date(2016, 1, 1))]
    for number, (company, quarter) in enumerate(partitions):
        part = [{**row, "company": company, "quarter": quarter} for row in rows[number::3]]
        store.write(store.partition_path("entities", company, quarter), tables.to_table(part, tables.ENTITIES))
    read_order = sorted((r for number, p in enumerate(partitions) for r in
                         [{**row, "company": p[0], "quarter": p[1]} for row in rows[number::3]]),
                        key=lambda r: (r["company"], r["quarter"], r["entity_id"]))
    in_memory = resolve_entities(tables.to_table(read_order, tables.ENTITIES))
    with duckdb.connect() as connection:
        from_files = resolve_entities(MentionSource(connection, store.relation(connection, store.partition_files("entities"))))
        assert from_files.canonical_entities.equals(in_memory.canonical_entities)
        assert from_files.mapping.equals(in_memory.mapping)
        assert from_files.mapping.num_rows == table.num_rows
    # as the step reads them: the names from a pack (tkg.store.packs), the embeddings from the files
    for number, (company, quarter) in enumerate(partitions):
        path = store.partition_path("entities", company, quarter)
        store.write(path, stamped(store.read(path), Stamp("entities", "code", {})))
    stamped_files(store, ["entities"])
    monkeypatch.setattr(packs, "MIN_FILES", 1)
    with duckdb.connect() as connection:
        files = store.partition_files("entities")
        from_packs = resolve_entities(MentionSource(connection, store.relation(connection, files),
                                                    light=packs.packed(store, connection, files)))
        assert list((store.parquet_root / packs.PACKS / "entities").glob("*.index.parquet"))
        assert from_packs.evidence.num_rows > 0
        assert from_packs.canonical_entities.equals(in_memory.canonical_entities)
        assert from_packs.mapping.equals(in_memory.mapping)


def test_each_mentions_canonical_is_joined_with_the_names_as_the_hash_table(tmp_path):
    """DuckDB estimates the mentions' scan low (the name filter gets a default selectivity of a
    fifth; on a 5M-event store it guessed 128,000 of 10.3M mentions): the mapping's hash table
    must still be built from the distinct names (the registered table), never from the
    mentions, or 10M mentions overrun the step's memory limit (as they did at 5M)."""
    import json
    from datetime import date

    import duckdb

    from tkg.resolve.resolution import MentionSource
    from tkg.store.parquet import ParquetStore

    store = ParquetStore(tmp_path)
    for number in range(30):  # 12,000 mentions of 3,300 names, more names than a fifth of the mentions
        names = [("Metric", f"metric {n}") for n in range(number * 100, number * 100 + 400)]
        store.write(store.partition_path("entities", "BBB", date(2016 + number // 4, 1 + 3 * (number % 4), 1)),
                    mentions(*names, start=number * len(names)))
    with duckdb.connect() as connection:
        resolution = resolve_entities(MentionSource(connection, store.relation(connection, store.partition_files("entities"))))
        relation = resolution.mapping_relation()
        plan = json.loads(connection.sql("EXPLAIN (FORMAT json) " + relation.sql_query()).fetchall()[0][1])

        def join(node):
            return node if node["name"] == "HASH_JOIN" else next(filter(None, map(join, node["children"])), None)

        probe, build = join(plan[0])["children"]  # DuckDB builds its hash table from the second child
        assert build["name"] == "PYTHON_ARROW_SCAN" and "PARQUET_SCAN" in json.dumps(probe)
        assert resolution.mapping.num_rows == 30 * 400


def test_the_evidence_of_names_that_extend_each_other_is_the_same_whatever_batches_or_order_it_is_read_in(monkeypatch):
    """At 10M events the wanted organisations' mentions are millions, so their evidence is read
    a batch at a time, in whatever order DuckDB scans them: each group's vector is the sum of
    its vectors of its longest length, normalised, the same to the last bit in batches of 3
    rows as in one and with the mentions in reverse order, and its descriptions (a digest of
    the set) are every mention's."""
    import numpy as np

    from tkg.resolve import resolution
    from tkg.resolve.resolution import MentionSource, _group_mentions, descriptions_digest

    rng = np.random.default_rng(7)
    rows = []
    for index in range(90):
        name = ("Micron", "Micron Memory", "Micron Technology")[index % 3]
        length = (8, 8, 4, 0)[index % 4]  # 'Micron Memory' has vectors of two lengths and none; the longest count
        rows.append({"entity_id": f"m{index:03d}", "event_id": "e", "company": "X", "quarter": None, "name": name,
                     "type": "Organization", "description": f"{name} text {index % 5}", "seen_at": T0,
                     "embedding": rng.standard_normal(length).astype(np.float32).tolist() if length else None})
    groups = _group_mentions(MentionSource.of_table(tables.to_table(rows, tables.ENTITIES)))
    wanted = list(range(len(groups)))
    whole = groups.evidence(wanted)
    monkeypatch.setattr(resolution, "EVIDENCE_BATCH_ROWS", 3)
    batched = _group_mentions(MentionSource.of_table(tables.to_table(rows, tables.ENTITIES))).evidence(wanted)
    reversed_groups = _group_mentions(MentionSource.of_table(tables.to_table(rows[::-1], tables.ENTITIES)))
    assert reversed_groups.names == groups.names
    backwards = reversed_groups.evidence(wanted)
    for group in wanted:
        name = groups.names[group]
        vectors = [row["embedding"] for row in rows if row["name"] == name and row["embedding"] is not None]
        longest = max(len(vector) for vector in vectors)
        total = np.sum([np.array(v, np.float64) for v in vectors if len(v) == longest], axis=0)
        assert whole[group][1].dtype == np.float32 and np.allclose(whole[group][1], total / np.linalg.norm(total), atol=1e-7)
        assert np.array_equal(batched[group][1], whole[group][1]) and np.array_equal(backwards[group][1], whole[group][1])
        assert batched[group][0] == whole[group][0] == backwards[group][0] == descriptions_digest(
            {row["description"] for row in rows if row["name"] == name})
        assert whole[group][0] != descriptions_digest({row["description"] for row in rows if row["name"] == name} | {"more"})


def test_a_block_scored_in_rows_gives_the_pairs_of_its_whole_matrix(monkeypatch):
    """A block's fuzzy scores are computed a few rows at a time (a block of 20,000 names at 10M
    events was 1.6 GB per scorer as one matrix): the same pairs, scores and order however few
    cells a piece holds."""
    import random

    import numpy as np
    from rapidfuzz import fuzz, process

    from tkg.resolve import resolution

    rng = random.Random(3)
    words = ["micron", "micro", "microsoft", "micron tech", "micros", "mic", "micron memory", "microchip", "mico"]
    names = sorted({rng.choice(words) + (" " + rng.choice(words) if rng.random() < 0.5 else "") for _ in range(400)})
    ratio = process.cdist(names, names, scorer=fuzz.ratio, score_cutoff=resolution.EXTENSION_THRESHOLD - 30)
    partial = process.cdist(names, names, scorer=fuzz.partial_ratio, score_cutoff=resolution.EXTENSION_THRESHOLD)
    whole = [(int(a), int(b), ratio[a, b], partial[a, b]) for a, b in zip(*np.nonzero(np.triu(np.maximum(ratio, partial), k=1)))]
    assert len(whole) > 100
    for cells in (1, 7, 1000, 10**9):
        monkeypatch.setattr(resolution, "SCORE_CELLS", cells)
        assert list(resolution._similar_pairs(names)) == whole


def _mentions_of(company: str, quarter, names: list[str], seed: int) -> pa.Table:
    """Organisation mentions of one partition, with descriptions and vectors."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return tables.to_table([
        {"entity_id": f"{company}-{quarter}-{index:03d}", "event_id": "e", "company": company, "quarter": quarter, "name": name,
         "type": "Organization", "description": f"{name} note {(seed + index) % 4}",
         "seen_at": T0 + timedelta(days=(seed * 7 + index) % 30),
         "embedding": rng.standard_normal(8).astype(np.float32).tolist()}
        for index, name in enumerate(names)], tables.ENTITIES)


def _resolved(store, previous: dict) -> tuple[dict, dict[str, pa.Table]]:
    """canonical_entities over `store` given the last output `previous` (its paths by table),
    its tables written where a run writes them: the counts, and the tables."""
    import duckdb

    from tkg.core.results import StageJob
    from tkg.resolve.stages import canonical_entities

    with duckdb.connect() as connection:
        result = canonical_entities(StageJob(None, {}, None, store=store, connection=connection, previous=previous))
        written = {name: (table if isinstance(table, pa.Table) else table.to_arrow_table())
                   for name, table in result.tables.items()}
    for name, table in written.items():
        store.write(store.global_path("canonical_entities", name), table)
    return result.counts, written


def _cold(tmp_path, partitions: dict, seeds: dict) -> dict[str, pa.Table]:
    """canonical_entities' tables over a store of just `partitions`, with no memo."""
    from tkg.store.parquet import ParquetStore

    store = ParquetStore(tmp_path)
    for key, names in partitions.items():
        store.write(store.partition_path("entities", *key), _mentions_of(*key, names, seeds[key]))
    counts, cold = _resolved(store, {})
    assert counts["evidence_groups_memo"] == counts["name_groups_merged"] == 0
    return cold


def _same_resolution(increment: dict[str, pa.Table], cold: dict[str, pa.Table]) -> None:
    for name in ("group_evidence", "name_groups", "entity_resolution"):
        assert increment[name].equals(cold[name]), name
    live = [table.filter(pa.compute.greater(table["mention_count"], 0))
            for table in (increment["canonical_entities"], cold["canonical_entities"])]
    assert live[0].equals(live[1])


def test_a_new_quarter_adds_to_what_resolution_read_last_and_equals_reading_every_mention(tmp_path):
    """Resolution keeps the name groups and the evidence it read (a memo). After a new quarter,
    the groups are the memo's merged with the new partitions', and a group's evidence is the
    memo's plus what the new partitions hold of it. When a partition was rewritten or is gone,
    the groups are grouped again from every mention, and so is the evidence of a group with a
    mention there (the others' is still added to). Either way every table equals, to the last
    bit, what a run without a memo reads."""
    from datetime import date

    from tkg.store.parquet import ParquetStore

    q1, q2 = date(2020, 1, 1), date(2020, 4, 1)
    first = {("A", q1): ["Micron", "Micron Memory"] * 3, ("B", q1): ["Micron Memory", "Micron"],
             ("C", q1): ["Acme", "Acme Robotics", "Acme"], ("D", q1): ["Zeta Labs Group", "Zeta"]}
    new = {("A", q2): ["Micron", "Micron Memory", "Micron"]}
    rewritten = {("C", q1): ["Acme", "Acme Robotics", "Acme Robotics"], ("B", q2): ["Micron"]}
    seeds = {key: seed for seed, key in enumerate([*first, *new, *rewritten])}
    store = ParquetStore(tmp_path / "increment")
    memo = {name: store.global_path("canonical_entities", name) for name in ("group_evidence", "name_groups", "mentions_read")}

    def write(partitions: dict) -> None:
        for key, names in partitions.items():
            store.write(store.partition_path("entities", *key), _mentions_of(*key, names, seeds[key]))

    write(first)
    counts, _ = _resolved(store, {})
    assert counts["evidence_groups_read"] >= 4 and counts["evidence_groups_memo"] == counts["name_groups_merged"] == 0
    write(new)
    counts, increment = _resolved(store, memo)
    assert counts["evidence_partitions_added"] == 1 and counts["evidence_partitions_stale"] == 0
    assert counts["name_groups_merged"] == 1 and counts["evidence_groups_memo"] >= 4 and counts["evidence_groups_read"] == 0
    _same_resolution(increment, _cold(tmp_path / "cold1", {**first, **new}, seeds))

    write(rewritten)
    store.delete_folder(store.parquet_root / "entities" / "company=D")
    counts, increment = _resolved(store, memo)
    assert counts["evidence_partitions_added"] == 2 and counts["evidence_partitions_stale"] == 2  # C rewritten, D gone
    assert counts["name_groups_merged"] == 0
    assert counts["evidence_groups_memo"] == 2 and counts["evidence_groups_read"] >= 2  # Micron's two; Acme's
    final = {key: names for key, names in {**first, **new, **rewritten}.items() if key[0] != "D"}
    cold = _cold(tmp_path / "cold2", final, seeds)
    micron = [row for row in cold["group_evidence"].to_pylist() if row["name"] == "Micron Memory"][0]
    assert micron["partitions"] == ["A|2020-01-01", "A|2020-04-01", "B|2020-01-01"]
    _same_resolution(increment, cold)
