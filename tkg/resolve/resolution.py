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

Grouping is computed from all current mentions at once and visits names in a fixed order, and
every live canonical (id, name, description, aliases) is a function of the mentions and the
company registry alone, so the result does not depend on the order partitions were ingested or
on earlier builds. A cluster's id hashes its earliest-seen name, which later calls never
change, so ids stay stable as new partitions arrive; ids an earlier build issued that no
longer name an entity are kept, with `merged_into` pointing at the entity holding their names.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import groupby
from typing import Any, Callable, Iterable, Iterator

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from nameparser import HumanName
from nicknames import NickNamer
from rapidfuzz import fuzz, process

from tkg.core import tables
from tkg.core.arrays import run_starts
from tkg.core.companies import Company, load_companies
from tkg.core.machine import room_for_duckdb
from tkg.core.names import company_for_name, fold, organisation_key
from tkg.core.roles import parse_offices

# Bump when resolution's rules change: canonical_entities is then rebuilt.
RESOLUTION_VERSION = "entity-resolution-4"
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
        """(given-name tokens, full given-name tokens, i.e. not initials)."""
        return len(self.given), sum(len(token) > 1 for token in self.given)


# 'Lisa Su', 'Colette M. Kress', 'Jen-Hsun Huang': capitalised words and initials, nothing
# nameparser would read as a title, suffix, particle or conjunction. nameparser (about 0.5 ms a
# name) splits these as first / middle / last by position, so they skip it.
_GIVEN = r"[A-Z][a-z]+(?:-[A-Z][a-z]+)?"
# 'Colette M. Kress', 'S.T. Sacconaghi', "Dave O'Connor", 'Kai S. DeYoung': nameparser splits
# these at the last space
_SURNAME = r"[A-Z](?:[a-z]|'?[A-Z])*[a-z]"  # 'Su', 'McNealy', "O'Connor", 'DiClemente'
_PLAIN_PERSON = re.compile(rf"(?:{_GIVEN}|(?:[A-Z]\.)+)(?: (?:[A-Z]\.|{_GIVEN})){{0,2}} {_SURNAME}")


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
    company = company_for_name(organization)
    return f"{_role_key(role)}@{company.ticker.lower() if company else organisation_key(organization)}"


@lru_cache(maxsize=65536)
def _role_key(role: str) -> str:
    """'Interim Chief Executive Officer' -> 'ceo': an interim CEO holds the CEO office. Roles
    repeat across organisations, so they are parsed once each."""
    offices = parse_offices(role)
    return fold(offices[0].role) if len(offices) == 1 else fold(role)


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


# --- folds and typed keys for many names at once ---------------------------------------------
# Metrics and amounts are most of the distinct names (13k of 16k in 100k synthetic mentions),
# and their keys cost ~10 us a name in Python. For names in printable ASCII (where Python's
# and polars' lower-casing, \w, \s and \d agree) folds and these keys are computed in polars;
# other names take the one-name functions. tests/test_resolution.py checks the two agree.
_PRINTABLE_ASCII = r"^[\x20-\x7e]*$"
_ASCII_FOLD = pl.col("name").str.to_lowercase().str.replace_all(r"[^a-z0-9_ ]", " ").str.replace_all(" +", " ").str.strip_chars(" ")


def _batch(names: list[str], expression: pl.Expr, one: Callable[[str], str], finish: Callable[[Any], str | None] | None = None) -> list[str]:
    """`expression` over the printable-ASCII names, then `finish` on each value; `one` for the
    other names and wherever a value is null."""
    frame = pl.DataFrame({"name": names}, schema={"name": pl.String})
    computed = frame.select(pl.when(pl.col("name").str.contains(_PRINTABLE_ASCII)).then(expression))[:, 0].to_list()
    if finish is not None:
        computed = [finish(value) if value is not None else None for value in computed]
    return [key if key is not None else one(name) for key, name in zip(computed, names)]


def metric_keys(names: list[str]) -> list[str]:
    """`metric_key` of each name."""
    _, tickers = _company_names()
    ordered = sorted(tickers, key=len, reverse=True)  # the regex's order: longest name first
    # One space around every word, so ' intel ' matches a whole word even right after another.
    spaced = pl.lit(" ") + _ASCII_FOLD.str.replace_all(" ", "  ") + pl.lit(" ")
    replaced = spaced.str.replace_many([f" {'  '.join(n.split())} " for n in ordered], [f" {tickers[n]} " for n in ordered], leftmost=True)
    words = replaced.str.replace_all(" +", " ").str.strip_chars(" ").str.split(" ")
    return _batch(names, words.list.sort().list.join(" "), metric_key)


def numeric_keys(names: list[str]) -> list[str]:
    """`numeric_key` of each name."""
    parts = pl.col("name").str.strip_chars().str.extract_groups(f"(?i){_AMOUNT.pattern}")
    unit = parts.struct.field("unit").str.to_lowercase().fill_null("")
    scale = parts.struct.field("scale").str.to_lowercase().replace_strict(_SCALE, default=1.0, return_dtype=pl.Float64).fill_null(1.0)
    amount = pl.struct(
        (parts.struct.field("number").str.replace_all(",", "").cast(pl.Float64) * scale).alias("value"),
        pl.when((parts.struct.field("dollar").fill_null("") != "") | unit.is_in(["dollars", "usd"])).then(pl.lit("usd"))
        .when(unit.is_in(["%", "percent", "per cent"])).then(pl.lit("pct")).otherwise(pl.lit("num")).alias("kind"),
    )
    return _batch(names, amount, numeric_key,
                  finish=lambda a: f"{a['kind']}:{a['value']:.6g}" if a["value"] is not None else None)


def folds(names: list[str]) -> list[str]:
    """`fold` of each name."""
    return _batch(names, _ASCII_FOLD, fold)


def typed_keys(types: list[str], names: list[str], folded: list[str]) -> list[str]:
    """`_alias_key` of each (type, name), given their folds; metrics and amounts computed together."""
    batched = {METRIC: metric_keys, NUMERIC: numeric_keys}
    keys = [_KEY_OF[t](n) if t in _KEY_OF and t not in batched else f for t, n, f in zip(types, names, folded)]
    for entity_type, batch in batched.items():
        positions = [i for i, t in enumerate(types) if t == entity_type]
        for position, key in zip(positions, batch([names[i] for i in positions])):
            keys[position] = key
    return keys


@lru_cache(maxsize=262144)
def product_key(name: str) -> str:
    """'Intel Xeon' and 'Xeon': the maker's name in front does not make another product."""
    pattern, _ = _company_names()
    stripped = " ".join(pattern.sub(" ", fold(name)).split())
    return stripped or fold(name)


def registry_id(company: Company) -> str:
    return f"cmp_{company.ticker}"


# --- name groups -----------------------------------------------------------------------------


class MentionSource:
    """The mentions resolution reads, as DuckDB view `view` (`mentions` unless named) on
    `connection`: the store's entity files read a column at a time (out of core), or an
    in-memory table.

    A mention's place (what "the first description" means, GROUPS_SQL) is its company,
    quarter and entity id, whatever order the files are read in. Its partition
    (`PARTITION_SQL`) is its company and quarter, as each stage writes them into its
    partition's rows; an in-memory table has none.

    `light`, when given, is the same mentions without their embeddings (the store's packs,
    tkg.store.packs): view `view` reads it, and only the evidence, which reads embeddings, reads
    `relation` (view `<view>_whole`)."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, relation: duckdb.DuckDBPyRelation, view: str = "mentions",
                 partitioned: bool = True, light: duckdb.DuckDBPyRelation | None = None) -> None:
        self.connection, self.view, self.whole_view = connection, view, f"{view}_whole" if light is not None else view
        # Names with their runs of spaces collapsed and ends trimmed, and types defaulted, as the
        # groups key them; the order columns say where each mention stands.
        partition = PARTITION_SQL if partitioned else "NULL::VARCHAR"
        for name, rows, embedding in ((self.whole_view, relation, "embedding, "), (view, light, "")):
            if rows is None:
                continue
            rows.create_view(f"_{name}_rows", replace=True)
            connection.execute(f"""
                CREATE OR REPLACE TEMP VIEW {name} AS
                SELECT entity_id, trim(regexp_replace(name, ' {{2,}}', ' ', 'g'), ' ') AS name, coalesce(type, 'Other') AS type,
                       description, seen_at, {embedding}company, quarter, {partition} AS partition
                FROM _{name}_rows""")

    @classmethod
    def of_table(cls, mentions: pa.Table, connection: duckdb.DuckDBPyConnection | None = None) -> MentionSource:
        """Mentions held in memory (tests, small stores): their row order is their order."""
        connection = connection or duckdb.connect()
        order = pa.array(range(mentions.num_rows), pa.int64())
        ordered = mentions.select([c for c in mentions.column_names if c not in ("company", "quarter")])
        ordered = ordered.append_column("company", pa.array([""] * mentions.num_rows, pa.string())).append_column("quarter", order)
        return cls(connection, connection.from_arrow(ordered), partitioned=False)


# A mention's partition, as `partition_key` names it.
PARTITION_SQL = "company || '|' || CAST(quarter AS VARCHAR)"


def partition_key(company: str, quarter: str) -> str:
    """The key of the partition (company, quarter as YYYY-MM-DD) a mention is in."""
    return f"{company}|{quarter}"


# Evidence vectors are added in fixed point: each component rounded once to a multiple of
# 2**-32, then summed as int64. The sums are exact, so they are the same in any order, cut
# into any batches or partitions, and a new partition's mentions add to a group's sum as it
# stands. (An int64 holds 2**31 mentions of components up to 1 in size.)
FIXED_POINT_SCALE = 2.0 ** 32


@dataclass
class GroupEvidence:
    """What a name group's evidence is made of: the distinct descriptions of its mentions, the
    fixed-point sum of its vectors of each length, and the partitions its mentions are in."""

    descriptions: set[str] = field(default_factory=set)
    sums: dict[int, np.ndarray] = field(default_factory=dict)  # length -> int64 sum
    partitions: set[str] = field(default_factory=set)

    def add(self, other: GroupEvidence) -> None:
        """Add the evidence of more mentions (of other partitions)."""
        self.descriptions |= other.descriptions
        self.partitions |= other.partitions
        for length, total in other.sums.items():
            self.add_sum(length, total)

    def add_sum(self, length: int, total: np.ndarray) -> None:
        """Add a fixed-point sum of vectors of `length` (never changing the array given)."""
        self.sums[length] = self.sums[length] + total if length in self.sums else total.copy()

    def evidence(self) -> tuple[bytes, np.ndarray | None]:
        """A digest of the description set (equal digests, equal sets), and the mean unit
        vector of the longest length (None without vectors)."""
        if not self.sums:
            return descriptions_digest(self.descriptions), None
        total = self.sums[max(self.sums)].astype(np.float64)
        norm = np.linalg.norm(total)
        return descriptions_digest(self.descriptions), (total / norm if norm else total).astype(np.float32)


@dataclass
class ResolutionMemo:
    """What a last run of resolution read: the evidence of the name groups it read, by (type,
    name), and its groups (the name of a view of them, `name_groups`, when it kept them);
    the partitions rewritten or gone since (`stale`), and the mentions of the partitions new or
    rewritten since (`added`, read from `added_files`).

    A group none of whose partitions is stale has its evidence as it stood plus what `added`
    holds of it; the others are read again from every mention. The groups are the memo's
    merged with those of `added` when no partition is stale, else grouped again."""

    evidence: dict[tuple[str, str], GroupEvidence]
    name_groups: str | None
    stale: set[str]
    added: MentionSource
    added_files: list = field(default_factory=list)  # the files `added` reads


@dataclass
class NameGroups:
    """Every distinct (type, name) of the mentions, sorted by type then name, as columns: the
    unit clustering works on.

    Description sets and embeddings are read only for the groups that need them (`evidence`):
    they only ever settle organisation names whose spellings extend each other, a few dozen
    in 100k mentions.
    """

    types: list[str]
    names: list[str]
    folded: list[str]  # fold(name)
    counts: list[int]
    descriptions: list[str | None]  # the first non-empty description (GROUPS_SQL)
    keys: list[str]  # the typed key (see _alias_key)
    seen: pl.DataFrame  # first_seen, last_seen per group
    source: MentionSource
    memo: ResolutionMemo | None = None
    grouped: pa.Table | None = None  # the groups as GROUPS_SQL gives them: the next run's memo
    read: dict[int, GroupEvidence] = field(default_factory=dict)  # the evidence of the groups wanted so far
    # groups whose evidence was read from every mention, and from the memo and the mentions added since
    read_counts: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.names)

    def evidence(self, wanted: Iterable[int]) -> dict[int, tuple[bytes, np.ndarray | None]]:
        """For each wanted group: a digest of the set of its mentions' distinct descriptions
        (equal digests, equal sets), and the mean unit embedding of those of its longest
        embedding length (None without embeddings). A group's evidence depends on its own
        mentions alone, not on which other groups are wanted with it, nor on the order its
        mentions are read in (see FIXED_POINT_SCALE).

        With a memo (`ResolutionMemo`), a group whose partitions all stand as they were is read
        only from the partitions added since; the others from every mention."""
        wanted = sorted(set(wanted))
        todo = [group for group in wanted if group not in self.read]
        memo = self.memo
        kept = {}
        if memo is not None:
            for group in todo:
                before = memo.evidence.get((self.types[group], self.names[group]))
                if before is not None and not before.partitions & memo.stale:
                    kept[group] = before
        self.read.update(self._read(self.source, [group for group in todo if group not in kept]))
        self.read_counts.update(evidence_groups_read=len(todo) - len(kept), evidence_groups_memo=len(kept))
        if kept:
            added = self._read(memo.added, sorted(kept))
            for group, before in kept.items():  # the memo's evidence is this run's to add to
                before.add(added[group])
                self.read[group] = before
        return {group: self.read[group].evidence() for group in wanted}

    def _read(self, source: MentionSource, wanted: list[int]) -> dict[int, GroupEvidence]:
        """The evidence of the `wanted` groups' mentions in `source`, read a batch at a time in
        whatever order DuckDB scans them: the wanted groups' mentions can be millions (every
        mention of a common organisation name)."""
        read = {group: GroupEvidence() for group in wanted}
        if not wanted:
            return read
        connection = source.connection
        connection.register("_wanted_groups", pa.table({"group": pa.array(wanted, pa.int64()),
                                                        "type": [self.types[g] for g in wanted],
                                                        "name": [self.names[g] for g in wanted]}))
        with room_for_duckdb(connection):  # the names above are much of the step's memory at 10M events
            reader = connection.sql(f"""
                SELECT w."group", m.description, m.embedding, m.partition
                FROM {source.whole_view} m JOIN _wanted_groups w USING (type, name)
                WHERE length(m.name) > 0""").fetch_record_batch(EVIDENCE_BATCH_ROWS)
            for batch in reader:
                owners = batch.column(0)
                for column, field_name in ((1, "descriptions"), (3, "partitions")):
                    values = batch.column(column)
                    present = pc.and_(pc.is_valid(values), pc.not_equal(values, ""))
                    distinct = pa.table({"group": owners, "value": values}).filter(pc.fill_null(present, False)) \
                        .group_by(["group", "value"]).aggregate([])
                    for group, value in zip(distinct.column("group").to_pylist(), distinct.column("value").to_pylist()):
                        getattr(read[group], field_name).add(value)
                for group, length, total in _fixed_point_sums(owners.to_numpy(), batch.column(2)):
                    read[group].add_sum(length, total)
        connection.unregister("_wanted_groups")
        return read

    def evidence_table(self) -> pa.Table:
        """The evidence of every group read (tables.GROUP_EVIDENCE): the next run's memo."""
        rows = []
        for group in sorted(self.read, key=lambda g: (self.types[g], self.names[g])):
            read = self.read[group]
            lengths = sorted(read.sums)
            rows.append({"type": self.types[group], "name": self.names[group], "descriptions": sorted(read.descriptions),
                         "partitions": sorted(read.partitions), "lengths": lengths,
                         "sums": [read.sums[length].tolist() for length in lengths]})
        return tables.to_table(rows, tables.GROUP_EVIDENCE)


def evidence_memo_groups(table: pa.Table) -> dict[tuple[str, str], GroupEvidence]:
    """`NameGroups.evidence_table` read back."""
    groups = {}
    for row in table.to_pylist():
        groups[(row["type"], row["name"])] = GroupEvidence(
            set(row["descriptions"]), {length: np.array(total, dtype=np.int64) for length, total in zip(row["lengths"], row["sums"])},
            set(row["partitions"]))
    return groups


def descriptions_digest(descriptions: set[str]) -> bytes:
    """A digest of a set of descriptions: equal for equal sets (the evidence compares sets)."""
    return hashlib.sha256("".join(f"{len(text)}:{text}" for text in sorted(descriptions)).encode()).digest()


# Rows of the wanted groups' mentions read at a time (`NameGroups.evidence`): a mention's
# embedding is a few KB, so a batch is tens of MB.
EVIDENCE_BATCH_ROWS = 16_384


def _fixed_point_sums(owners: np.ndarray, embeddings: pa.Array) -> Iterator[tuple[int, int, np.ndarray]]:
    """(owner, length, int64 sum) of a batch's vectors (FIXED_POINT_SCALE), per owner and
    vector length; null and empty vectors add nothing."""
    lengths = pc.fill_null(pc.list_value_length(embeddings), 0).to_numpy(zero_copy_only=False)
    for length in np.unique(lengths[lengths > 0]).tolist():
        chosen = lengths == length
        rows = embeddings.filter(pa.array(chosen))
        values = np.asarray(rows.flatten().to_numpy(zero_copy_only=False), dtype=np.float64).reshape(-1, length)
        fixed = np.rint(values * FIXED_POINT_SCALE).astype(np.int64)
        chosen_owners = owners[chosen]
        order = np.argsort(chosen_owners, kind="stable")
        sorted_owners = chosen_owners[order]
        starts = run_starts(sorted_owners)
        totals = np.add.reduceat(fixed[order], starts, axis=0)
        for owner, total in zip(sorted_owners[starts].tolist(), totals):
            yield owner, length, total


# Each distinct (type, name) of a view of mentions: its mentions, its first description (the
# least (company, quarter, entity id, description) of its mentions with one) and when it was
# first and last seen. Every column is an aggregate that merges: the groups of two sets of
# mentions, grouped again (`MERGE_GROUPS_SQL`), are the groups of both.
GROUPS_SQL = """
    SELECT type, name, count(*) AS count,
           min(struct_pack(company, quarter, entity_id, description)) FILTER (WHERE description IS NOT NULL AND description <> '')
               AS first_description,
           min(seen_at) AS first_seen, max(seen_at) AS last_seen
    FROM {view} WHERE length(name) > 0
    GROUP BY type, name"""
MERGE_GROUPS_SQL = """
    SELECT type, name, sum(count)::BIGINT AS count, min(first_description) AS first_description,
           min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM ({parts}) GROUP BY type, name"""


def _group_mentions(source: MentionSource, memo: ResolutionMemo | None = None) -> NameGroups:
    """Mentions by (type, exact name), whitespace collapsed; mentions without a name are left out.
    DuckDB groups them out of core; only the distinct names come back. With a memo whose
    partitions all stand (`ResolutionMemo`), the groups it holds are merged with those of the
    mentions added since, not grouped again from every mention."""
    connection = source.connection
    merged = memo is not None and memo.name_groups is not None and not memo.stale
    if merged:
        query = MERGE_GROUPS_SQL.format(parts=f"SELECT * FROM {memo.name_groups} UNION ALL "
                                              f"{GROUPS_SQL.format(view=memo.added.view)}")
    else:
        query = GROUPS_SQL.format(view=source.view)
    table = connection.sql(f"{query} ORDER BY type, name").to_arrow_table()
    types, names = table.column("type").to_pylist(), table.column("name").to_pylist()
    folded = folds(names)
    descriptions = pc.struct_field(table.column("first_description"), "description").to_pylist()
    return NameGroups(
        types=types, names=names, folded=folded, counts=table.column("count").to_pylist(), descriptions=descriptions,
        keys=typed_keys(types, names, folded), seen=pl.from_arrow(table.select(["first_seen", "last_seen"])), source=source,
        memo=memo, grouped=table, read_counts=Counter(name_groups_merged=int(merged)),
    )


# --- clustering ------------------------------------------------------------------------------


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

    def labels(self) -> np.ndarray:
        """Each item's root: items of one set share a label."""
        return np.array([self.find(item) for item in range(len(self.parent))], dtype=np.int64)


def _cluster_people(names: list[str], counts: list[int]) -> list[list[int]]:
    """Anchor clustering within surname blocks: the most complete names found clusters, and a
    name joins the first cluster all of whose members it matches."""
    parsed = [parse_person(name) for name in names]
    blocks: dict[str, list[int]] = defaultdict(list)
    clusters: list[list[int]] = []
    for index, person in enumerate(parsed):
        if person is None:
            clusters.append([index])  # a single word is not a person's full name: leave it alone
        else:
            blocks[person.last].append(index)
    for members in blocks.values():
        members.sort(key=lambda i: (-parsed[i].informativeness[0], -parsed[i].informativeness[1], -counts[i], names[i]))
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


def _cluster_fuzzy(keys: list[str], agree: Callable[[list[tuple[int, int]]], list[bool]] | None = None) -> np.ndarray:
    """The cluster label of each key: fuzzy clustering within blocks (first key token, and acronym for organisations),
    scored with rapidfuzz.process.cdist on all cores rather than pair loops in Python.

    `agree` is given for organisations only: it turns on acronym matching and settles names
    that extend each other ('Micron' / 'Micron Memory') on their descriptions."""
    organisations = agree is not None
    finder = _UnionFind(len(keys))
    # Exact keys first: 'Intel Corp.' and 'Intel Corporation' share the key 'intel'.
    by_key: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in by_key:
            finder.union(by_key[key], index)
        else:
            by_key[key] = index
    blocks: dict[str, list[int]] = defaultdict(list)
    undecided: list[tuple[int, int]] = []  # extensions for `agree` to settle, all at once
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
        for a, b, ratio, partial in _similar_pairs(names):
            one, other = names[a], names[b]
            if _digits(one) != _digits(other):
                continue  # 'revenue q3 2016' is not 'revenue q4 2016'
            if ratio >= FUZZY_THRESHOLD:
                finder.union(members[a], members[b])
            elif organisations and partial >= EXTENSION_THRESHOLD:
                short, long = sorted((one, other), key=len)
                if _extends(short, long):
                    finder.union(members[a], members[b])
                else:
                    undecided.append((members[a], members[b]))
    if undecided:
        for (a, b), agreed in zip(undecided, agree(undecided)):
            if agreed:
                finder.union(a, b)
    return finder.labels()


# Scores of one block computed at a time, in rows of names against the whole block: a block of
# 20,000 names (a common first word at 10M events) as one matrix was 1.6 GB per scorer.
SCORE_CELLS = 4_000_000


def _similar_pairs(names: list[str]) -> Iterator[tuple[int, int, float, float]]:
    """The pairs (a < b) of `names` whose ratio or partial ratio reaches the bands clustering
    looks at, with both scores, in row-major order."""
    workers = -1 if len(names) > 256 else 1  # threads cost more than they save on small blocks
    rows = max(1, SCORE_CELLS // len(names))
    for low in range(0, len(names), rows):
        chunk = names[low:low + rows]
        ratio = process.cdist(chunk, names, scorer=fuzz.ratio, workers=workers, score_cutoff=EXTENSION_THRESHOLD - 30)
        partial = process.cdist(chunk, names, scorer=fuzz.partial_ratio, workers=workers, score_cutoff=EXTENSION_THRESHOLD)
        for a, b in zip(*np.nonzero(np.triu(np.maximum(ratio, partial), k=low + 1))):
            yield low + int(a), int(b), ratio[a, b], partial[a, b]


def _descriptions_agree(groups: NameGroups, pairs: list[tuple[int, int]], offset: int = 0) -> list[bool]:
    """Description embeddings settle names that extend each other ('Micron' / 'Micron Memory'),
    unless both descriptions are the same boilerplate (then they say nothing). `pairs` index
    groups from `offset`."""
    pairs = [(offset + a, offset + b) for a, b in pairs]
    evidence = groups.evidence(group for pair in pairs for group in pair)

    def agree(a: int, b: int) -> bool:
        (descriptions_a, vector_a), (descriptions_b, vector_b) = evidence[a], evidence[b]
        if vector_a is None or vector_b is None or vector_a.shape != vector_b.shape or descriptions_a == descriptions_b:
            return False  # no evidence, vectors of two embedders, or the same boilerplate
        return float(np.dot(vector_a, vector_b)) >= DESCRIPTION_COSINE

    return [agree(a, b) for a, b in pairs]


def _representatives(groups: NameGroups, labels: np.ndarray) -> np.ndarray:
    """The representative group of each cluster (indexed by cluster number). For people it is
    the most complete spelling ('Robert H. Swan' over 'Bob Swan'), then the most frequent. For
    other types it is the medoid: the member with the highest summed similarity to the others,
    weighted by mentions. Ties go to the more frequent, then the longer, then the later name.

    In a two-member cluster the sums are 100*w1 + r*w2 and r*w1 + 100*w2: the more frequent
    name wins, or they tie, so only clusters of three or more are scored."""
    size = len(labels)
    if not size:
        return labels
    cluster_sizes = np.bincount(labels)[labels]
    person = np.array([t == PERSON for t in groups.types], dtype=bool)
    # Sort keys, most significant first. People: full given-name tokens, given-name tokens.
    # Other types: the medoid total (0 in clusters of one or two). Then, for all: mentions, the
    # folded length (0 for people), and the name (within a type, group order is name order).
    primary, secondary = np.zeros(size), np.zeros(size)
    for group in np.flatnonzero(person & (cluster_sizes > 1)).tolist():
        parsed = parse_person(groups.names[group])
        if parsed:
            tokens, full_tokens = parsed.informativeness
            primary[group], secondary[group] = full_tokens, tokens
    scored = np.flatnonzero(~person & (cluster_sizes >= 3))
    if len(scored):
        primary += _medoid_totals(groups, labels, scored)
    length = np.where(person, 0, np.array([len(f) for f in groups.folded], dtype=np.int64))
    order = np.lexsort((np.arange(size), length, np.asarray(groups.counts), secondary, primary, labels))
    return order[np.r_[run_starts(labels[order])[1:], size] - 1]  # the last (largest) of each cluster


def _medoid_totals(groups: NameGroups, labels: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """For each scored group, its summed similarity (fuzz.ratio of folded names) to every member
    of its cluster, itself included, weighted by their mention counts; 0 for other groups.

    All pairs of all clusters are scored in one `cpdist` call. Each product of a float32 score
    and a count is exact in float64, and so are these short sums, so the totals do not depend
    on the order they are added in."""
    members = scored[np.argsort(labels[scored], kind="stable")]  # cluster by cluster
    starts = run_starts(labels[members])
    lengths = np.diff(np.r_[starts, len(members)])
    left, right = [], []
    for length in np.unique(lengths).tolist():  # clusters of one size at a time: a matrix of members
        matrix = members[starts[lengths == length][:, None] + np.arange(length)]
        a, b = np.triu_indices(length)  # every pair, and each name with itself
        left.append(matrix[:, a].ravel())
        right.append(matrix[:, b].ravel())
    left_index, right_index = np.concatenate(left), np.concatenate(right)
    folded = groups.folded
    scores = process.cpdist([folded[g] for g in left_index.tolist()], [folded[g] for g in right_index.tolist()],
                            scorer=fuzz.ratio, workers=-1).astype(np.float64)
    weights = np.asarray(groups.counts, dtype=np.float64)
    totals = np.bincount(left_index, scores * weights[right_index], minlength=len(labels))
    off_diagonal = left_index != right_index
    totals += np.bincount(right_index[off_diagonal], (scores * weights[left_index])[off_diagonal], minlength=len(labels))
    return totals


def cluster_groups(groups: NameGroups) -> np.ndarray:
    """The cluster number of each group: groups that denote the same entity share one. Types
    are clustered separately, and numbers follow the (type, first name) order of clusters."""
    labels = np.zeros(len(groups), dtype=np.int64)
    start = offset = 0
    for entity_type, run in groupby(groups.types):
        stop = start + sum(1 for _ in run)
        names, keys = groups.names[start:stop], groups.keys[start:stop]
        if entity_type == PERSON:
            local = _labels_of(_cluster_people(names, groups.counts[start:stop]), stop - start)
        elif entity_type in EXACT_TYPES:
            codes: dict[str, int] = {}
            local = np.array([codes.setdefault(key, len(codes)) for key in keys], dtype=np.int64)
        elif entity_type == ORGANIZATION:
            local = _cluster_fuzzy(keys, agree=partial(_descriptions_agree, groups, offset=start))
        else:
            local = _cluster_fuzzy(keys)
        labels[start:stop] = local + offset
        offset += int(local.max()) + 1
        start = stop
    return _renumbered(labels)


def _labels_of(clusters: list[list[int]], size: int) -> np.ndarray:
    labels = np.empty(size, dtype=np.int64)
    for number, members in enumerate(clusters):
        labels[members] = number
    return labels


def _renumbered(labels: np.ndarray) -> np.ndarray:
    """Cluster numbers 0, 1, ... in the order of each cluster's first group."""
    if not len(labels):
        return labels
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse.ravel()]


def _new_id(entity_type: str, folded_name: str) -> str:
    """The id of a new canonical: a hash of its type and folded name."""
    return "ent_" + hashlib.sha256(f"{entity_type}\x1f{folded_name}".encode()).hexdigest()[:16]


# --- the resolver ----------------------------------------------------------------------------


@dataclass
class Resolution:
    canonical_entities: pa.Table
    names: pa.Table  # type, name, canonical_id, method: every distinct name's canonical
    counts: Counter
    source: MentionSource
    evidence: pa.Table  # tables.GROUP_EVIDENCE: the evidence read, ...
    name_groups: pa.Table  # ... and the groups (GROUPS_SQL): the next run's memo

    def mapping_relation(self) -> duckdb.DuckDBPyRelation:
        """Each mention's canonical (the `entity_resolution` table), computed by DuckDB: by
        entity id (then canonical and method, so even a repeated id does not depend on row order)."""
        connection = self.source.connection
        connection.register("_resolved_names", self.names)
        # The hash table must hold the distinct names, never the mentions. DuckDB estimates the
        # mentions' scan low (its name filter gets a default selectivity): on a 5M-event store
        # it guessed 128,000 of 10.3M mentions, built the table from them and ran out of the
        # step's memory. As written, `_resolved_names` is the build side; the optimizers that
        # would flip it by those estimates are off on this connection, the resolution step's own.
        connection.execute("SET disabled_optimizers = 'join_order,build_side_probe_side'")
        return connection.sql(f"""
            SELECT m.entity_id, n.canonical_id, n.method, NULL::DOUBLE AS score
            FROM {self.source.view} m JOIN _resolved_names n USING (type, name)
            WHERE length(m.name) > 0
            ORDER BY m.entity_id, n.canonical_id NULLS LAST, n.method NULLS LAST""")

    @property
    def mapping(self) -> pa.Table:
        """`mapping_relation` in memory (for small inputs)."""
        return self.mapping_relation().to_arrow_table().cast(tables.ENTITY_RESOLUTION)


def _registry_canonicals() -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str]]:
    """The configured companies as canonicals, and each of their aliases' (type, key)."""
    known_alias: dict[tuple[str, str], str] = {}
    registry: dict[str, dict[str, Any]] = {}
    for company in load_companies().values():
        canonical_id = registry_id(company)
        registry[canonical_id] = {"canonical_id": canonical_id, "name": company.name, "type": ORGANIZATION,
                                  "description": f"{company.name} ({company.ticker})", "first_seen": None, "source": "registry",
                                  "aliases": sorted({company.name, company.ticker, *company.aliases})}
        for alias in (company.name, company.ticker, *company.aliases):
            known_alias[(ORGANIZATION, organisation_key(alias))] = canonical_id
    return registry, known_alias


def resolve_entities(mentions: pa.Table | MentionSource, previous: pa.Table | None = None,
                     memo: ResolutionMemo | None = None) -> Resolution:
    """Resolve all mentions (a table, or a source over the store's files).

    Every live canonical (its id, name, description and aliases) is a function of the mentions
    and the company registry alone, so the same mentions give the same entities however and in
    whatever order they were built. A cluster's id hashes its earliest-seen name, which later
    calls do not change, so ids stay stable as partitions arrive. `previous` (the last
    registry) only contributes the ids it issued that no longer name a live entity: they are
    kept, with `merged_into` pointing at the entity that now holds their names. `memo`: what
    the last run read (its name groups and evidence), which only saves reading it again.

    Only distinct names are held in memory; each mention's canonical id is a join of the
    mentions with `Resolution.names` (`Resolution.mapping_relation`), streamed where it is used."""
    counts: Counter = Counter()
    source = mentions if isinstance(mentions, MentionSource) else MentionSource.of_table(mentions)
    groups = _group_mentions(source, memo)
    registry, known_alias = _registry_canonicals()
    known = [known_alias.get(pair) for pair in zip(groups.types, groups.keys)]
    cluster_of = _join_registry_clusters(cluster_groups(groups), known, registry)  # group -> its cluster's number
    names, types = groups.names, groups.types
    representatives = _representatives(groups, cluster_of).tolist()

    ids, canonical_names, methods = _assign_canonicals(groups, cluster_of, representatives, known, registry, counts)
    counts.update(f"clusters_{method}" for method in methods)
    columns = {
        "canonical_id": ids, "name": canonical_names, "type": [types[r] for r in representatives],
        "description": [(registry.get(cid) or {}).get("description") or groups.descriptions[r] or "" for cid, r in zip(ids, representatives)],
        "source": ["registry" if method == "registry" else "mentions" for method in methods],
    }
    known_aliases = [(number, alias) for number, cid in enumerate(ids) if cid in registry for alias in registry[cid]["aliases"]]
    live = _cluster_table(columns, groups, cluster_of, known_aliases)
    # Configured companies are entities even before a call mentions them (their names resolve).
    unmentioned = [{**row, "mention_count": 0, "merged_into": None} for cid, row in sorted(registry.items()) if cid not in set(ids)]
    live = pa.concat_tables([live, tables.to_table(unmentioned, tables.CANONICAL_ENTITIES)])
    retired = _retired(previous, live, registry)
    canonical_entities = pa.concat_tables([live, retired])
    counts["canonical_entities"] = live.num_rows
    counts["retired_ids_kept"] = retired.num_rows

    # Each name gets its cluster's canonical; the method says whether it is the canonical name.
    canonical = pl.Series("canonical_id", ids, dtype=pl.String).gather(cluster_of)
    method = pl.Series("method", methods, dtype=pl.String).gather(cluster_of)
    is_alias = pl.Series(names, dtype=pl.String).ne_missing(pl.Series(canonical_names, dtype=pl.String).gather(cluster_of))
    method = pl.select(pl.when(is_alias).then(method + ":alias").otherwise(method)).to_series().alias("method")
    resolved_names = pa.table({"type": pa.array(types, pa.string()), "name": pa.array(names, pa.string()),
                               "canonical_id": canonical.to_arrow(), "method": method.to_arrow()})
    counts["mentions"] = sum(groups.counts)
    counts.update(groups.read_counts)
    return Resolution(canonical_entities=canonical_entities.sort_by("canonical_id"), names=resolved_names, counts=counts,
                      source=source, evidence=groups.evidence_table(), name_groups=groups.grouped)


def _retired(previous: pa.Table | None, live: pa.Table, registry: dict[str, dict[str, Any]]) -> pa.Table:
    """Ids the previous registry issued that no longer name a live entity, never deleted: with
    no mentions now, and `merged_into` the live entity that holds one of their names."""
    if previous is None or not previous.num_rows:
        return tables.CANONICAL_ENTITIES.empty_table()
    # most of the previous registry is live, and most retired ids point at a live entity:
    # only the rest is read into Python, and the live aliases only for ids whose entity went too
    named_now = pa.concat_arrays([live.column("canonical_id").combine_chunks().cast(pa.string()),
                                  pa.array(sorted(registry), pa.string())])
    gone = previous.filter(pc.invert(pc.is_in(previous.column("canonical_id"), value_set=named_now)))
    if not gone.num_rows:
        return tables.CANONICAL_ENTITIES.empty_table()
    live_ids = set(live.column("canonical_id").to_pylist())
    kept = [{**{column: row.get(column) for column in tables.CANONICAL_ENTITIES.names}, "mention_count": 0}
            for row in gone.to_pylist()]
    orphans = [row for row in kept if not row["merged_into"] or row["merged_into"] not in live_ids]
    holder: dict[tuple[str, str], str] = {}
    for row in live.select(["canonical_id", "type", "aliases"]).to_pylist() if orphans else ():
        for alias in row["aliases"] or ():
            holder.setdefault((row["type"], _alias_key(row["type"], alias)), row["canonical_id"])
    for row in orphans:  # retired now, or merged into an entity gone since: the live one holding one of its names
        names = [row["name"], *(row["aliases"] or ())]
        row["merged_into"] = next((holder[(row["type"], _alias_key(row["type"], name))] for name in names
                                   if name and (row["type"], _alias_key(row["type"], name)) in holder), None)
    return tables.to_table(sorted(kept, key=lambda r: r["canonical_id"]), tables.CANONICAL_ENTITIES)


def _assign_canonicals(groups: NameGroups, cluster_of: np.ndarray, representatives: list[int], known: list[str | None],
                       registry: dict[str, dict[str, Any]], counts: Counter) -> tuple[list[str], list[str], list[str]]:
    """Each cluster's canonical id, name and method, in cluster order.

    A cluster holding a configured company's name is that company (its registry id and legal
    name). Any other cluster is named by its representative and keyed by its earliest-seen
    name (ties by name): later calls never change that name, so the id stays put as
    partitions arrive. A cluster reaching an id an earlier cluster took is split off."""
    names, types = groups.names, groups.types
    first_seen = groups.seen["first_seen"].to_list()
    earliest: dict[int, int] = {}
    for group, number in enumerate(cluster_of.tolist()):
        best = earliest.get(number)
        if best is None or _seen_order(first_seen[group], names[group]) < _seen_order(first_seen[best], names[best]):
            earliest[number] = group
    ids = [_new_id(types[r], groups.folded[earliest[number]]) for number, r in enumerate(representatives)]
    canonical_names = [names[r] for r in representatives]
    methods = ["cluster"] * len(representatives)
    companies: dict[int, set[str]] = defaultdict(set)
    for group, canonical_id in enumerate(known):
        if canonical_id:
            companies[int(cluster_of[group])].add(canonical_id)
    for number, found in companies.items():
        if len(found) > 1:
            counts["registry_companies_in_one_cluster"] += 1  # never merge two configured companies
        canonical_id = min(found)
        ids[number], canonical_names[number], methods[number] = canonical_id, registry[canonical_id]["name"], "registry"
    taken: set[str] = set()
    for number, canonical_id in enumerate(ids):
        if canonical_id in taken:
            counts["clusters_sharing_a_canonical"] += 1
            r = representatives[number]
            while canonical_id in taken:  # 'SU', 'Su' and 'su' stay apart but fold alike
                canonical_id = _new_id(types[r], fold(names[r] + "#" + canonical_id))
            ids[number], canonical_names[number], methods[number] = canonical_id, names[r], "split"
        taken.add(canonical_id)
    return ids, canonical_names, methods


def _seen_order(seen: Any, name: str) -> tuple:
    return (seen is None, seen.timestamp() if seen is not None else 0.0, name)


def _cluster_table(columns: dict[str, list], groups: NameGroups, cluster_of: np.ndarray,
                   known_aliases: list[tuple[int, str]]) -> pa.Table:
    """The canonical rows of this run's clusters: mention counts, first and last seen, and the
    sorted aliases (the cluster's names and those its canonical already had)."""
    seen = (
        groups.seen.with_columns(pl.Series("cluster", cluster_of), pl.Series("count", groups.counts, dtype=pl.Int64))
        .group_by("cluster").agg(pl.col("count").sum().alias("mention_count"), pl.col("first_seen").min(), pl.col("last_seen").max())
        .sort("cluster")
    )
    aliases = (
        pl.concat([pl.DataFrame({"cluster": cluster_of, "alias": groups.names}, schema={"cluster": pl.Int64, "alias": pl.String}),
                   pl.DataFrame(known_aliases, schema={"cluster": pl.Int64, "alias": pl.String}, orient="row")])
        .unique().group_by("cluster").agg(pl.col("alias").sort().alias("aliases")).sort("cluster")
    )
    data = {**columns, "aliases": aliases["aliases"].to_arrow(), "merged_into": [None] * len(columns["canonical_id"])}
    return pa.table({field.name: data[field.name] if field.name in data else seen[field.name].to_arrow()
                     for field in tables.CANONICAL_ENTITIES}, schema=tables.CANONICAL_ENTITIES)


def _join_registry_clusters(labels: np.ndarray, known: list[str | None], registry: dict) -> np.ndarray:
    """Clusters that name the same configured company are one entity, whatever the fuzzy
    matching made of them: 'INTC' and 'Intel Corporation' share no letters worth scoring."""
    by_company: dict[str, set[int]] = defaultdict(set)
    for group, canonical_id in enumerate(known):
        if canonical_id and canonical_id in registry:
            by_company[canonical_id].add(int(labels[group]))
    if not by_company:
        return labels
    finder = _UnionFind(int(labels.max()) + 1)
    for clusters in by_company.values():
        first, *others = sorted(clusters)
        for other in others:
            finder.union(first, other)
    return _renumbered(finder.labels()[labels])


# The key two names of one type must share to be the same entity (or to match a known alias).
_KEY_OF = {ORGANIZATION: organisation_key, ROLE: office_key, METRIC: metric_key, NUMERIC: numeric_key, PRODUCT: product_key}
EXACT_TYPES = {ROLE, METRIC, NUMERIC}  # resolved by key equality alone, no fuzzy matching


def _alias_key(entity_type: str, name: str) -> str:
    return _KEY_OF.get(entity_type, fold)(name)
