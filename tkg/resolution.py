"""Entity resolution: map every mention to a canonical entity, with stable ids.

The structure follows the seed (REFERENCE 1.7): entities are grouped by type, clustered on
their names, each cluster's medoid names it, acronyms are matched, and clusters are matched
against canonicals that already exist. What changes is how names are compared:

- people: names are parsed (nameparser); two names match when the surnames agree and the given
  names align token by token, where a token matches the same token, its initial, a nickname
  ('Bob' = 'Robert', `nicknames`) or a prefix ('Jen' = 'Jensen'). Sharing a first name only
  is never enough, and different middle initials keep people apart.
- organisations: legal suffixes are stripped (cleanco) and the company registry (tickers,
  legal names, aliases) seeds canonicals, so 'AMD' and 'Advanced Micro Devices, Inc.' are one
  entity. Fuzzy matching uses whole-string ratios, never `partial_ratio`, whose substring
  scores merge 'Micron' with 'Microsoft'; a name that only extends another ('Micron' vs
  'Micron Technology') merges when the extra words are generic corporate words or the
  description embeddings agree.
- offices ('CFO of Intel Corporation') match exactly on (role, organisation); metrics and
  numbers match exactly; other types fuzzily with their digits required to agree.

Grouping is computed from all current mentions at once and visits names in a fixed order, so
it does not depend on the order partitions were ingested. Ids come from the previous registry
when a cluster contains a name it already knew: existing canonicals are never renamed or
re-keyed, and when one cluster joins two of them the older survives and the merge is recorded.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import polars as pl
import pyarrow as pa
from nameparser import HumanName
from nicknames import NickNamer
from rapidfuzz import fuzz, process

from tkg import tables
from tkg.companies import Company, load_companies
from tkg.embeddings import embedding_matrix
from tkg.names import company_for_name, fold, organisation_key
from tkg.roles import parse_offices

FUZZY_THRESHOLD = 92  # whole-string ratio on folded names (seed: partial_ratio >= 80)
EXTENSION_THRESHOLD = 90  # partial_ratio band where one name extends another
DESCRIPTION_COSINE = 0.85
GENERIC_ORG_WORDS = {
    "technology", "technologies", "systems", "networks", "semiconductor", "semiconductors", "corporation", "corp",
    "company", "co", "incorporated", "inc", "group", "holding", "holdings", "international", "labs", "laboratories",
    "communications", "solutions", "software", "electronics", "devices", "computer", "computers", "industries",
}
PERSON, ORGANIZATION, ROLE = "Person", "Organization", "Role"
METRIC, NUMERIC, PRODUCT = "Metric", "Numeric", "Product"


@lru_cache(maxsize=1)
def _nicknamer() -> NickNamer:
    return NickNamer()


@lru_cache(maxsize=200_000)
def _nickname_match(a: str, b: str) -> bool:
    namer = _nicknamer()
    return b in namer.nicknames_of(a) or b in namer.canonicals_of(a) or bool(namer.canonicals_of(a) & namer.canonicals_of(b))


# --- people ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PersonName:
    given: tuple[str, ...]
    last: str

    @property
    def informativeness(self) -> tuple[int, int]:
        """More tokens first, then more full (non-initial) tokens."""
        return len(self.given), sum(len(token) > 1 for token in self.given)


# 'Lisa Su', 'Colette M. Kress', 'Jen-Hsun Huang': capitalised words and initials, nothing
# nameparser would read as a title, suffix, particle or conjunction. nameparser (about 0.5 ms a
# name) splits these as first / middle / last by position, so they skip it.
_GIVEN = r"[A-Z][a-z]+(?:-[A-Z][a-z]+)?"
# 'Colette M. Kress', 'S.T. Sacconaghi', 'Kyle P. McNealy': nameparser splits these at the last space
_PLAIN_PERSON = re.compile(rf"(?:{_GIVEN}|(?:[A-Z]\.)+)(?: (?:[A-Z]\.|{_GIVEN})){{0,2}} (?:Mc|Mac)?[A-Z][a-z]+")


@lru_cache(maxsize=1)
def _nameparser_words() -> frozenset[str]:
    from nameparser.config import CONSTANTS

    words: set[str] = set()
    for kind in ("titles", "suffix_acronyms", "suffix_not_acronyms", "suffix_acronyms_ambiguous", "prefixes",
                 "conjunctions", "first_name_titles", "bound_first_names", "non_first_name_prefixes"):
        words.update(str(word).lower() for word in getattr(CONSTANTS, kind, ()))
    return frozenset(words)


def _name_parts(name: str) -> tuple[str, str]:
    """(first and middle names, last name) as nameparser splits them."""
    if _PLAIN_PERSON.fullmatch(name):
        words = name.split(" ")
        if not any(word.rstrip(".").lower() in _nameparser_words() for word in words):
            return " ".join(words[:-1]), words[-1]
    parsed = HumanName(name)
    return f"{parsed.first} {parsed.middle}", parsed.last


@lru_cache(maxsize=200_000)
def parse_person(name: str) -> PersonName | None:
    given_text, last = _name_parts(name)
    last = fold(last)
    # 'R.J.M.' -> r, j, m and 'Jen-Hsun' -> jen, hsun: initials and parts align token by token.
    given = tuple(fold(t) for t in re.split(r"[\s.\-]+", given_text) if fold(t))
    if not last or not given:
        return None
    return PersonName(given=given, last=last)


@lru_cache(maxsize=65536)
def _initials_of(token: str) -> frozenset[str]:
    """First letters a given name can be abbreviated to: its own, and its formal names' ('Bob' -> b, r)."""
    return frozenset({token[0]} | {name[0] for name in _nicknamer().canonicals_of(token) if name})


def _given_token_match(a: str, b: str) -> bool:
    if a == b:
        return True
    if len(a) == 1 or len(b) == 1:
        initial, full = (a, b) if len(a) == 1 else (b, a)
        return initial in _initials_of(full)
    if min(len(a), len(b)) >= 3 and (a.startswith(b) or b.startswith(a)):
        return True
    return _nickname_match(a, b)


def people_match(a: PersonName, b: PersonName) -> bool:
    """Same surname, and the given names align token by token (the shorter may stop early)."""
    if a.last != b.last:
        return False
    return all(_given_token_match(x, y) for x, y in zip(a.given, b.given))


# --- organisations and offices ---------------------------------------------------------------


def _acronym(key: str) -> str:
    return "".join(word[0] for word in key.split() if word)


def _digits(text: str) -> tuple[str, ...]:
    return tuple(sorted(re.findall(r"\d+", text)))


@lru_cache(maxsize=65536)
def office_key(name: str) -> str:
    """'CFO of Intel Corp.' and 'Chief Financial Officer of Intel Corporation' -> 'cfo@intc'."""
    role, separator, organization = name.rpartition(" of ")
    if not separator:
        return fold(name)
    offices = parse_offices(role)
    role_key = fold(offices[0].role) if len(offices) == 1 else fold(role)  # an interim CEO holds the CEO office
    company = company_for_name(organization)
    return f"{role_key}@{company.ticker.lower() if company else organisation_key(organization)}"


@lru_cache(maxsize=1)
def _company_names() -> tuple[re.Pattern, dict[str, str]]:
    """Every registry name, alias and ticker as folded words, longest first."""
    names: dict[str, str] = {}
    for company in load_companies().values():
        for name in (company.name, company.ticker, *company.aliases, organisation_key(company.name)):
            if fold(name):
                names.setdefault(fold(name), company.ticker.lower())
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"\b({pattern})\b"), names


def _with_tickers(text: str) -> str:
    pattern, names = _company_names()
    return pattern.sub(lambda m: names[m[1]], fold(text))


@lru_cache(maxsize=262144)
def metric_key(name: str) -> str:
    """'Intel Corporation revenue Q3 2016' = 'Intel revenue Q3 2016' = 'revenue Q3 2016 Intel'."""
    return " ".join(sorted(_with_tickers(name).split()))


_SCALE = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9, "b": 1e9,
          "trillion": 1e12, "tn": 1e12, "t": 1e12}
_AMOUNT = re.compile(r"^(?P<dollar>\$|us\$|usd\s*)?\s*(?P<number>\d[\d,]*(?:\.\d+)?|\.\d+)\s*"
                     r"(?P<scale>thousand|million|billion|trillion|mn|bn|tn|k|m|b|t)?\.?\s*"
                     r"(?P<unit>%|percent|per cent|dollars|usd)?$", re.IGNORECASE)


@lru_cache(maxsize=262144)
def numeric_key(name: str) -> str:
    """'$15.8B' = '$15.8 billion' = '15.8 billion dollars'; '10%' = '10 percent'; else the folded text."""
    match = _AMOUNT.match(name.strip())
    if not match:
        return fold(name)
    value = float(match["number"].replace(",", "")) * _SCALE.get((match["scale"] or "").lower(), 1.0)
    unit = (match["unit"] or "").lower()
    kind = "usd" if match["dollar"] or unit in {"dollars", "usd"} else "pct" if unit in {"%", "percent", "per cent"} else "num"
    return f"{kind}:{value:.6g}"


@lru_cache(maxsize=262144)
def product_key(name: str) -> str:
    """'Intel Xeon' and 'Xeon': the maker's name in front does not make another product."""
    pattern, _ = _company_names()
    stripped = " ".join(pattern.sub(" ", fold(name)).split())
    return stripped or fold(name)


def registry_id(company: Company) -> str:
    return f"cmp_{company.ticker}"


# --- clustering ------------------------------------------------------------------------------


@dataclass
class NameGroup:
    """All mentions sharing one (type, exact name): the unit that clustering works on."""

    type: str
    name: str
    mention_ids: list[str] = field(default_factory=list)
    descriptions: list[str] = field(default_factory=list)
    embedding: np.ndarray | None = None
    first_seen: datetime | None = None
    last_seen: datetime | None = None

    @property
    def count(self) -> int:
        return len(self.mention_ids)


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, item: int) -> int:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: int, b: int) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[max(root_a, root_b)] = min(root_a, root_b)


def _cluster_people(groups: list[NameGroup]) -> list[list[int]]:
    """Anchor clustering within surname blocks: the most complete names found clusters, and a
    name joins the first cluster all of whose members it matches."""
    parsed = [parse_person(g.name) for g in groups]
    blocks: dict[str, list[int]] = defaultdict(list)
    clusters: list[list[int]] = []
    for index, person in enumerate(parsed):
        if person is None:
            clusters.append([index])  # a single word is not a person's full name: leave it alone
        else:
            blocks[person.last].append(index)
    for members in blocks.values():
        members.sort(key=lambda i: (-parsed[i].informativeness[0], -parsed[i].informativeness[1], -groups[i].count, groups[i].name))
        block_clusters: list[list[int]] = []
        for index in members:
            for cluster in block_clusters:
                if all(people_match(parsed[index], parsed[other]) for other in cluster):
                    cluster.append(index)
                    break
            else:
                block_clusters.append([index])
        clusters.extend(block_clusters)
    return clusters


def _extends(short: str, long: str) -> bool:
    """'micron' extended by generic words only: 'micron technology'."""
    short_words, long_words = short.split(), long.split()
    return long_words[: len(short_words)] == short_words and all(w in GENERIC_ORG_WORDS for w in long_words[len(short_words):])


def _cluster_fuzzy(groups: list[NameGroup], key_of, organisations: bool) -> list[list[int]]:
    """Fuzzy clustering within blocks (first key token, and acronym for organisations), scored
    with rapidfuzz.process.cdist on all cores rather than pair loops in Python."""
    keys = [key_of(g.name) for g in groups]
    finder = _UnionFind(len(groups))
    # Exact keys first: 'Intel Corp.' and 'Intel Corporation' share the key 'intel'.
    by_key: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in by_key:
            finder.union(by_key[key], index)
        else:
            by_key[key] = index
    blocks: dict[str, list[int]] = defaultdict(list)
    for key, index in by_key.items():
        words = key.split()
        if words:
            blocks[words[0][:4]].append(index)
        if organisations and len(words) > 1:
            blocks[f"acronym:{_acronym(key)}"].append(index)
        if organisations and len(words) == 1:
            blocks[f"acronym:{key}"].append(index)
    for block, members in blocks.items():
        if len(members) < 2:
            continue
        names = [keys[i] for i in members]
        if block.startswith("acronym:"):
            for a in range(len(members)):
                for b in range(a + 1, len(members)):
                    one, other = names[a], names[b]
                    single, multi = (one, other) if len(one.split()) == 1 else (other, one)
                    if len(single.split()) == 1 and len(multi.split()) > 1 and len(single) >= 2 and single == _acronym(multi):
                        finder.union(members[a], members[b])
            continue
        workers = -1 if len(names) > 256 else 1  # threads cost more than they save on small blocks
        ratio = process.cdist(names, names, scorer=fuzz.ratio, workers=workers, score_cutoff=EXTENSION_THRESHOLD - 30)
        partial = process.cdist(names, names, scorer=fuzz.partial_ratio, workers=workers, score_cutoff=EXTENSION_THRESHOLD)
        for a, b in zip(*np.nonzero(np.triu(np.maximum(ratio, partial), k=1))):
            one, other = names[a], names[b]
            if _digits(one) != _digits(other):
                continue  # 'revenue q3 2016' is not 'revenue q4 2016'
            if ratio[a, b] >= FUZZY_THRESHOLD:
                finder.union(members[a], members[b])
            elif organisations and partial[a, b] >= EXTENSION_THRESHOLD:
                short, long = sorted((one, other), key=len)
                if _extends(short, long) or _descriptions_agree(groups[members[a]], groups[members[b]]):
                    finder.union(members[a], members[b])
    clusters: dict[int, list[int]] = defaultdict(list)
    for index in range(len(groups)):
        clusters[finder.find(index)].append(index)
    return list(clusters.values())


def _descriptions_agree(a: NameGroup, b: NameGroup) -> bool:
    """Description embeddings settle names that extend each other ('Micron' / 'Micron Memory'),
    unless both descriptions are the same boilerplate (then they say nothing)."""
    if a.embedding is None or b.embedding is None or set(a.descriptions) == set(b.descriptions):
        return False
    return float(np.dot(a.embedding, b.embedding)) >= DESCRIPTION_COSINE


def _medoid(groups: list[NameGroup], members: list[int]) -> int:
    """The member with the highest summed similarity to the others, weighted by mentions."""
    if len(members) == 1:
        return members[0]
    names = [fold(groups[i].name) for i in members]
    scores = process.cdist(names, names, scorer=fuzz.ratio, workers=-1 if len(names) > 256 else 1)
    weights = np.array([groups[i].count for i in members], dtype=np.float64)
    totals = scores @ weights
    best = max(range(len(members)), key=lambda j: (totals[j], groups[members[j]].count, len(names[j]), groups[members[j]].name))
    return members[best]


def _person_representative(groups: list[NameGroup], members: list[int]) -> int:
    """The most complete spelling ('Robert H. Swan' over 'Bob Swan'), then the most frequent."""
    def rank(i: int) -> tuple:
        person = parse_person(groups[i].name)
        full = person.informativeness if person else (0, 0)
        return (full[1], full[0], groups[i].count, groups[i].name)
    return max(members, key=rank)


# --- the resolver ----------------------------------------------------------------------------


@dataclass
class Resolution:
    canonical_entities: pa.Table
    mapping: pa.Table
    counts: Counter
    path: Path | None = None


def _group_mentions(mentions: pa.Table) -> list[NameGroup]:
    """One NameGroup per (type, exact name), with the mean description embedding."""
    frame = (
        pl.from_arrow(mentions.select(["entity_id", "name", "type", "description", "seen_at"]))
        .with_row_index("row")
        .with_columns(pl.col("name").str.split(" ").list.eval(pl.element().filter(pl.element() != "")).list.join(" "),
                      pl.col("type").fill_null("Other"))
        .filter(pl.col("name").str.len_chars() > 0)
    )
    grouped = (
        frame.group_by(["type", "name"], maintain_order=True)
        .agg(pl.col("entity_id"), pl.col("row"),
             pl.col("description").filter(pl.col("description").is_not_null() & (pl.col("description") != "")).unique(maintain_order=True),
             pl.col("seen_at").min().alias("first_seen"), pl.col("seen_at").max().alias("last_seen"))
        .sort(["type", "name"])
    )
    # Description embeddings only ever settle organisation names (see _descriptions_agree).
    organisations = grouped.with_row_index("group").filter(pl.col("type") == ORGANIZATION)
    vectors: dict[int, np.ndarray] = {}
    if organisations.height:
        exploded = organisations.select("group", "row").explode("row")
        vectors = _mean_embeddings(mentions.column("embedding"), exploded["row"].to_numpy(), exploded["group"].to_numpy())
    columns = grouped.select(["type", "name", "entity_id", "description", "first_seen", "last_seen"]).to_dict(as_series=False)
    return [
        NameGroup(type=entity_type, name=name, mention_ids=ids, descriptions=descriptions, embedding=vectors.get(index),
                  first_seen=first, last_seen=last)
        for index, (entity_type, name, ids, descriptions, first, last) in enumerate(zip(*columns.values()))
    ]


def _mean_embeddings(column: pa.ChunkedArray, rows: np.ndarray, groups: np.ndarray) -> dict[int, np.ndarray]:
    """Mean unit vector per group over the given mention rows that have an embedding."""
    matrix, present = embedding_matrix(column.take(pa.array(rows)))
    if not present.any():
        return {}
    # one pass: rows sorted by group, summed per run (not a scan of all rows per group)
    groups = groups[present]
    order = np.argsort(groups, kind="stable")
    starts = np.flatnonzero(np.r_[True, groups[order][1:] != groups[order][:-1]])
    totals = np.add.reduceat(matrix[order], starts, axis=0)
    norms = np.linalg.norm(totals, axis=1)
    return {int(group): total / norm if norm else total
            for group, total, norm in zip(groups[order][starts], totals, norms)}


def cluster_groups(groups: list[NameGroup]) -> list[list[NameGroup]]:
    """Clusters of name groups that denote the same entity, type by type."""
    by_type: dict[str, list[NameGroup]] = defaultdict(list)
    for group in groups:
        by_type[group.type].append(group)
    clusters: list[list[NameGroup]] = []
    for entity_type, typed in sorted(by_type.items()):
        key_of = _KEY_OF.get(entity_type, fold)
        if entity_type == PERSON:
            index_clusters = _cluster_people(typed)
        elif entity_type in EXACT_TYPES:
            index_clusters = _exact_clusters(typed, key_of)
        else:
            index_clusters = _cluster_fuzzy(typed, key_of, organisations=entity_type == ORGANIZATION)
        clusters.extend([typed[i] for i in members] for members in index_clusters)
    return clusters


def _exact_clusters(groups: list[NameGroup], key_of) -> list[list[int]]:
    by_key: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_key[key_of(group.name)].append(index)
    return list(by_key.values())


def _new_id(entity_type: str, name: str) -> str:
    return "ent_" + hashlib.sha256(f"{entity_type}\x1f{fold(name)}".encode()).hexdigest()[:16]


def resolve_entities(mentions: pa.Table, previous: pa.Table | None = None) -> Resolution:
    """Resolve all mentions; `previous` is the last canonical registry (ids and names kept)."""
    counts: Counter = Counter()
    groups = _group_mentions(mentions)
    clusters = cluster_groups(groups)

    # Who already has an id: the registry companies, then the previous run's canonicals.
    known_alias: dict[tuple[str, str], str] = {}
    prior: dict[str, dict[str, Any]] = {}
    for company in load_companies().values():
        canonical_id = registry_id(company)
        prior[canonical_id] = {"canonical_id": canonical_id, "name": company.name, "type": ORGANIZATION,
                               "description": f"{company.name} ({company.ticker})", "first_seen": None, "source": "registry",
                               "aliases": sorted({company.name, company.ticker, *company.aliases})}
        for alias in (company.name, company.ticker, *company.aliases):
            known_alias[(ORGANIZATION, organisation_key(alias))] = canonical_id
    if previous is not None and previous.num_rows:
        for row in previous.to_pylist():
            if row["canonical_id"] in prior and prior[row["canonical_id"]]["source"] == "registry":
                continue
            prior[row["canonical_id"]] = row
            if row.get("merged_into"):
                continue
            for alias in row.get("aliases") or [row["name"]]:
                known_alias.setdefault((row["type"], _alias_key(row["type"], alias)), row["canonical_id"])

    clusters = _join_registry_clusters(clusters, known_alias, prior)
    canonical_rows: dict[str, dict[str, Any]] = {}
    mapped_ids: list[str] = []
    mapped_canonicals: list[str] = []
    mapped_methods: list[str] = []
    merges: dict[str, str] = {}
    for cluster in sorted(clusters, key=lambda c: (c[0].type, min(g.name for g in c))):
        entity_type = cluster[0].type
        candidates = sorted({known for g in cluster if (known := known_alias.get((entity_type, _alias_key(entity_type, g.name))))})
        members = list(range(len(cluster)))
        representative = cluster[_person_representative(cluster, members) if entity_type == PERSON else _medoid(cluster, members)]
        if candidates:
            # The oldest known canonical survives; the others are recorded as merged into it.
            candidates.sort(key=lambda cid: (prior[cid]["source"] != "registry", _seen_key(prior[cid]), cid))
            canonical_id = candidates[0]
            for other in candidates[1:]:
                if prior[other]["source"] == "registry":
                    counts["registry_companies_in_one_cluster"] += 1  # never merge two configured companies
                    continue
                merges[other] = canonical_id
            name = prior[canonical_id]["name"]
            method = "registry" if prior[canonical_id]["source"] == "registry" else "existing"
        else:
            canonical_id, name, method = _new_id(entity_type, representative.name), representative.name, "new"
        if canonical_id in canonical_rows:
            counts["clusters_sharing_a_canonical"] += 1
            canonical_id, name, method = _new_id(entity_type, representative.name + "#" + canonical_id), representative.name, "split"
        aliases = sorted({g.name for g in cluster} | set(prior.get(canonical_id, {}).get("aliases") or []))
        firsts = [g.first_seen for g in cluster if g.first_seen is not None]
        lasts = [g.last_seen for g in cluster if g.last_seen is not None]
        canonical_rows[canonical_id] = {
            "canonical_id": canonical_id, "name": name, "type": entity_type,
            "description": (prior.get(canonical_id) or {}).get("description") or (representative.descriptions[0] if representative.descriptions else ""),
            "aliases": aliases, "mention_count": sum(g.count for g in cluster),
            "first_seen": min(firsts) if firsts else None, "last_seen": max(lasts) if lasts else None,
            "merged_into": None, "source": "registry" if method == "registry" else "mentions",
        }
        for group in cluster:
            mapped_ids.extend(group.mention_ids)
            mapped_canonicals.extend([canonical_id] * group.count)
            mapped_methods.extend([method if group.name == name else f"{method}:alias"] * group.count)
        counts[f"clusters_{method}"] += 1

    # Canonicals that still exist from earlier runs stay in the registry (never deleted).
    for canonical_id, row in prior.items():
        if canonical_id in canonical_rows:
            continue
        kept = {column: row.get(column) for column in tables.CANONICAL_ENTITIES.names}
        kept["mention_count"] = 0
        kept["merged_into"] = merges.get(canonical_id, row.get("merged_into"))
        canonical_rows[canonical_id] = kept
    counts["canonical_entities"] = sum(1 for r in canonical_rows.values() if not r["merged_into"])
    counts["mentions"] = len(mapped_ids)
    counts["merges_recorded"] = len(merges)
    mapping = pa.table({"entity_id": pa.array(mapped_ids, pa.string()), "canonical_id": pa.array(mapped_canonicals, pa.string()),
                        "method": pa.array(mapped_methods, pa.string()), "score": pa.nulls(len(mapped_ids), pa.float64())},
                       schema=tables.ENTITY_RESOLUTION)
    return Resolution(
        canonical_entities=tables.to_table(sorted(canonical_rows.values(), key=lambda r: r["canonical_id"]), tables.CANONICAL_ENTITIES),
        mapping=mapping.sort_by("entity_id"),
        counts=counts,
    )


def _join_registry_clusters(clusters: list[list[NameGroup]], known_alias: dict, prior: dict) -> list[list[NameGroup]]:
    """Clusters that name the same configured company are one entity, whatever the fuzzy
    matching made of them: 'INTC' and 'Intel Corporation' share no letters worth scoring."""
    by_company: dict[str, list[int]] = defaultdict(list)
    for index, cluster in enumerate(clusters):
        entity_type = cluster[0].type
        companies = {known_alias.get((entity_type, _alias_key(entity_type, g.name))) for g in cluster}
        for canonical_id in companies:
            if canonical_id and prior[canonical_id]["source"] == "registry":
                by_company[canonical_id].append(index)
    finder = _UnionFind(len(clusters))
    for members in by_company.values():
        for other in members[1:]:
            finder.union(members[0], other)
    joined: dict[int, list[NameGroup]] = defaultdict(list)
    for index, cluster in enumerate(clusters):
        joined[finder.find(index)].extend(cluster)
    return list(joined.values())


def _seen_key(row: dict[str, Any]) -> tuple:
    seen = row.get("first_seen")
    return (0, seen.timestamp()) if seen is not None else (1, 0.0)


# The key two names of one type must share to be the same entity (or to match a known alias).
_KEY_OF = {ORGANIZATION: organisation_key, ROLE: office_key, METRIC: metric_key, NUMERIC: numeric_key, PRODUCT: product_key}
EXACT_TYPES = {ROLE, METRIC, NUMERIC}  # resolved by key equality alone, no fuzzy matching


def _alias_key(entity_type: str, name: str) -> str:
    return _KEY_OF.get(entity_type, fold)(name)


def aliases_of(resolution: Resolution) -> Iterable[tuple[str, str]]:
    for row in resolution.canonical_entities.to_pylist():
        for alias in row["aliases"] or []:
            yield alias, row["canonical_id"]
