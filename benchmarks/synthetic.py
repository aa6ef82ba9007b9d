"""Deterministic synthetic entity mentions and temporal events, built from real names.

The universe of entities comes from the real earnings-call corpus (participants' names,
titles and organisations of all 188 calls, parsed with tkg's own transcript parser) plus the
company registry (`tkg/config/companies.yaml`) and a curated list of real companies, products,
places and concepts that earnings calls of these ten companies talk about. Every entity is an
*identity* with a ground-truth cluster id and a set of *surfaces* (the strings a real
extraction pipeline emits for it), each tagged with the kind of variant it is:

- people: the spellings the corpus itself uses ('Lisa Su' / 'Lisa T. Su', 'Bob Swan' /
  'Robert H. Swan', 'R.J.M. Dassen' / 'Roger J. M. Dassen', even the corpus typo 'Mark
  Moskowtiz'), plus derived ones: middle names dropped or reduced to an initial, all-initials
  forms, common English nicknames (Robert->Bob, Charles->Chuck, Timothy->Tim, ...) and, rarely,
  a transposition typo in the surname. Up to 600 extra people (463 with the default seed) recombine real first names
  and surnames of the corpus, which multiplies the real traps (same surname, different
  person; same first name, different person).
- organisations: registry legal names, aliases and tickers, the corpus spellings of the
  analyst firms ('Bernstein', 'Sanford C. Bernstein & Co., LLC., Research Division'), and real
  customers/suppliers/competitors with their legal suffixes, tickers and acronyms, including
  the traps Micron/Microsoft/Microchip, Apple/Applied Materials, Intel/Intelsat,
  Samsung/Samsung SDI, HP Inc./Hewlett Packard Enterprise, Amazon/Amazon Web Services.
- offices ('CFO of Intel Corporation', 'CFO of Intel Corp.', 'Chief Financial Officer of
  Intel Corporation'), metrics with periods ('Intel revenue Q3 2016', 'Intel Corporation
  revenue Q3 2016', 'Intel Q3 2016 revenue'), guidance targets, numbers ('$15.8 billion' /
  '$15.8B', '10%' / '10 percent'), products ('Xeon' / 'Intel Xeon', 'iPhone 7' vs 'iPhone 8'),
  places ('U.S.' / 'United States', 'India' vs 'Indiana') and concepts ('AI').

A surface that two identities would both produce is dropped from both: every surface in the
data has exactly one true identity, so no resolver is asked the impossible.

Events: for each of the 188 real calls (company, call date, fiscal quarter), statements are
drawn from templates: the call's real officers restated each quarter (HOLDS_ROLE, DYNAMIC), so
the corpus' real successions (Stacy Smith -> Robert H. Swan -> George S. Davis as Intel's CFO,
Mark Durcan -> Sanjay Mehrotra at Micron, ...) become invalidations, analysts' affiliations,
other companies' officers with synthetic successions, results and year-ago restatements
(STATIC), guidance targets revised from call to call (DYNAMIC, some with an explicit end),
products, partners, launches, headquarters, and OPINION / PREDICTION / ATEMPORAL statements
that invalidation must ignore. Triplet endpoints are the identities' ground-truth ids, so both
candidate selectors see the same canonical entities; statement embeddings are wordllama's.
Each event records what it asserts (office and holder, guidance target and value) so the
expected invalidations can be computed from the event set.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tkg.core import tables

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("TKG_BENCH_CORPUS", ROOT.parent / "shared" / "data" / "earnings_calls" / "transcripts.parquet"))
GOLD = Path(os.environ.get("TKG_BENCH_GOLD", ROOT.parent / "shared" / "eval" / "gold_dev.jsonl"))
SEED = 20240611
TYPES = ("Person", "Organization", "Role", "Product", "Metric", "Location", "Numeric", "Other")
# Share of mentions per entity type (an earnings call's triplets: companies and numbers dominate).
TYPE_SHARE = {"Organization": 0.24, "Person": 0.16, "Role": 0.07, "Metric": 0.20, "Numeric": 0.18,
              "Product": 0.09, "Location": 0.03, "Other": 0.03}


class CorpusMissing(RuntimeError):
    pass


def simple_fold(text: str) -> str:
    """Lower-case, accents and punctuation removed (the generator's own, not tkg's)."""
    text = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


# ------------------------------------------------------------------------------------------
# The real corpus
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    company: str
    call_date: date
    call_datetime: datetime
    fiscal_quarter: str  # 'Q3 2016'
    fiscal_year: int
    period_start: date
    period_end: date


@dataclass(frozen=True)
class RealParticipant:
    name: str
    organization: str
    title: str
    kind: str  # corporate / conference
    call: Call


@lru_cache(maxsize=1)
def load_corpus(path: str = str(CORPUS)) -> tuple[tuple[Call, ...], tuple[RealParticipant, ...]]:
    if not Path(path).exists():
        raise CorpusMissing(
            f"the real earnings-call corpus {path} is absent; the benchmark builds its names from it "
            "(set TKG_BENCH_CORPUS to another copy of transcripts.parquet)")
    from tkg.core.companies import get_company
    from tkg.ingest.parsing import parse_transcript
    from tkg.ingest.sources import load_source

    calls, participants = [], []
    for row in load_source(path).rows:
        transcript = parse_transcript(row, get_company(row.company))
        call = Call(row.company, row.call_date, transcript.call_datetime.astimezone(UTC), transcript.fiscal_quarter,
                    transcript.fiscal_year, transcript.fiscal_period_start, transcript.fiscal_period_end)
        calls.append(call)
        for p in transcript.participants:
            name = p.name.strip()
            if not name or name.lower().startswith("unidentified"):
                continue
            participants.append(RealParticipant(name, (p.organization or "").strip(), (p.title or "").strip(), p.kind, call))
    calls.sort(key=lambda c: (c.company, c.call_date))
    return tuple(calls), tuple(participants)


# ------------------------------------------------------------------------------------------
# Identities
# ------------------------------------------------------------------------------------------


@dataclass
class Identity:
    cluster_id: str
    type: str
    canonical: str
    surfaces: dict[str, str] = field(default_factory=dict)  # surface -> variant kind
    variant_weight: dict[str, float] = field(default_factory=dict)  # kind -> weight
    descriptions: list[str] = field(default_factory=list)
    company: str | None = None  # ticker of the registry company the entity belongs to
    weight: float = 1.0

    def add(self, surface: str, kind: str) -> None:
        surface = surface.strip()
        if surface and surface not in self.surfaces:
            self.surfaces[surface] = kind


# Written for this benchmark: common English given-name nicknames (full -> short forms).
NICKNAMES = {
    "robert": ["Bob", "Rob"], "charles": ["Chuck", "Charlie"], "timothy": ["Tim"], "william": ["Bill", "Will"],
    "james": ["Jim", "Jamie"], "michael": ["Mike"], "christopher": ["Chris"], "stephen": ["Steve"], "steven": ["Steve"],
    "joseph": ["Joe"], "douglas": ["Doug"], "kenneth": ["Ken"], "benjamin": ["Ben"], "matthew": ["Matt"],
    "philip": ["Phil"], "ronald": ["Ron"], "daniel": ["Dan"], "david": ["Dave"], "jeffrey": ["Jeff"], "gregory": ["Greg"],
    "mitchell": ["Mitch"], "kathryn": ["Katy", "Kate"], "thomas": ["Tom"], "andrew": ["Andy"], "anthony": ["Tony"],
    "edward": ["Ed", "Ted"], "richard": ["Rick", "Dick"], "samuel": ["Sam"], "nicholas": ["Nick"], "patrick": ["Pat"],
    "elizabeth": ["Liz", "Beth"], "jennifer": ["Jen"], "alexander": ["Alex"], "frederick": ["Fred"], "lawrence": ["Larry"],
    "peter": ["Pete"], "walter": ["Walt"], "bradley": ["Brad"], "jonathan": ["Jon"], "roderick": ["Rod"],
    "ernest": ["Ernie"], "rajvindra": ["Raji"], "kasthuri": ["Kash"], "kevin": [], "brian": [], "mark": [],
}
# Corpus spellings whose identity a rule cannot see (decided by reading the corpus).
PERSON_KEY_OVERRIDES = {
    "Bob Swan": ("swan", "r"),            # Robert H. Swan, Intel CFO then CEO
    "Toni Sacconaghi": ("sacconaghi", "a"),  # A.M. (Antonio M.) Sacconaghi, Bernstein
    "Kirk Materne": ("materne", "s"),     # Stewart Kirk Materne, Evercore
    "Mark Moskowtiz": ("moskowitz", "m"),  # a typo of Mark Moskowitz in the transcripts
}


def person_tokens(name: str) -> tuple[list[str], str]:
    tokens = re.findall(r"[A-Za-z][A-Za-z'\-]*\.?", name)
    given = [t.rstrip(".") for t in tokens[:-1]]
    return given, tokens[-1].rstrip(".") if tokens else ""


def _informativeness(name: str) -> tuple[int, int, int]:
    given, _ = person_tokens(name)
    return len(given), sum(len(g) > 1 for g in given), len(name)


class Universe:
    """All identities, their surfaces and the lookups the generators need."""

    def __init__(self, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self._owner: dict[tuple[str, str], str] | None = None
        self.calls, self.participants = load_corpus()
        from tkg.core.companies import load_companies

        self.registry = {t: c for t, c in load_companies().items() if t not in {"HLIO", "QNTX"}}  # the fictional sample
        self.identities: dict[str, Identity] = {}
        self.short = {t: SHORT_NAMES.get(t, c.name.split()[0]) for t, c in self.registry.items()}
        self._build_organisations()
        self._build_people()
        self._build_offices()
        self._build_metrics()
        self._build_numbers()
        self._build_products()
        self._build_places_and_concepts()
        self.dropped_ambiguous = self._drop_ambiguous_surfaces()
        self.by_type: dict[str, list[Identity]] = defaultdict(list)
        for identity in self.identities.values():
            if identity.surfaces:
                self.by_type[identity.type].append(identity)
        for typed in self.by_type.values():
            typed.sort(key=lambda i: i.cluster_id)

    def add(self, identity: Identity) -> Identity:
        if identity.cluster_id in self.identities:
            raise ValueError(f"duplicate identity {identity.cluster_id}")
        self.identities[identity.cluster_id] = identity
        return identity

    # --- organisations ----------------------------------------------------------------------

    def _build_organisations(self) -> None:
        corpus_orgs = sorted({p.organization for p in self.participants if p.organization})
        for ticker, company in sorted(self.registry.items()):
            identity = self.add(Identity(f"org:{ticker}", "Organization", company.name, company=ticker, weight=60.0,
                                         descriptions=list(REGISTRY_DESCRIPTIONS[ticker])))
            identity.add(company.name, "canonical")
            for alias in company.aliases:
                identity.add(alias, "alias")
            identity.add(ticker, "ticker")
            for form in LEGAL_FORMS.get(ticker, []):
                identity.add(form, "legal_suffix")
            identity.variant_weight = {"canonical": 5, "alias": 4, "ticker": 0.6, "legal_suffix": 1, "corpus": 1}
        firms: dict[str, Identity] = {}
        for org in corpus_orgs:
            ticker = self._registry_ticker(org)
            if ticker:
                self.identities[f"org:{ticker}"].add(org, "corpus")
                continue
            key = firm_key(org)
            if key == "google":
                continue  # added with the other real companies below
            firm = firms.get(key)
            if firm is None:
                firm = firms[key] = self.add(Identity(f"org:firm:{key}", "Organization", org, weight=4.0,
                                                      descriptions=["Sell-side equity research firm", "Investment bank covering technology stocks"]))
                firm.variant_weight = {"canonical": 3, "corpus": 2}
                firm.add(org, "canonical")
            else:
                firm.add(org, "corpus")
        for canonical, variants, description, weight in OTHER_COMPANIES:
            key = simple_fold(canonical).replace(" ", "_")
            identity = self.add(Identity(f"org:{key}", "Organization", canonical, weight=weight, descriptions=[description]))
            identity.add(canonical, "canonical")
            for variant in variants:
                kind = "acronym" if variant.isupper() and " " not in variant and len(variant) <= 5 else "legal_suffix" if variant.startswith(canonical.split()[0]) else "alias"
                identity.add(variant, kind)
            identity.variant_weight = {"canonical": 5, "legal_suffix": 1.5, "alias": 1.5, "acronym": 1.5}
        for key, firm in firms.items():
            # The canonical spelling of a firm: its shortest corpus spelling ('Bernstein').
            shortest = min(firm.surfaces, key=lambda s: (len(s), s))
            firm.canonical = shortest
            firm.surfaces = {s: ("canonical" if s == shortest else "corpus") for s in firm.surfaces}

    def _registry_ticker(self, org: str) -> str | None:
        folded = simple_fold(org)
        for ticker, company in self.registry.items():
            names = [company.name, *company.aliases]
            if any(folded == simple_fold(n) or folded.startswith(simple_fold(n) + " ") for n in names):
                return ticker
        return None

    # --- people -----------------------------------------------------------------------------

    def _build_people(self) -> None:
        groups: dict[tuple[str, str], list[RealParticipant]] = defaultdict(list)
        for p in self.participants:
            key = PERSON_KEY_OVERRIDES.get(p.name)
            if key is None:
                given, last = person_tokens(p.name)
                if not given or not last:
                    continue
                key = (simple_fold(last), simple_fold(given[0])[:1])
            groups[key].append(p)
        self.real_people: dict[str, Identity] = {}
        used_keys = set(groups)
        for key in sorted(groups):
            members = groups[key]
            names = sorted({p.name for p in members})
            primary = max(names, key=lambda n: (_informativeness(n), n))
            if primary in PERSON_KEY_OVERRIDES:  # never make a nickname or a typo the canonical
                primary = max((n for n in names if n not in PERSON_KEY_OVERRIDES), key=lambda n: (_informativeness(n), n))
            corporate = [p for p in members if p.kind == "corporate"]
            anchor = corporate[-1] if corporate else members[-1]
            org = anchor.organization or self.registry[anchor.call.company].name
            description = (f"{anchor.title or 'Executive'} of {org}" if corporate else f"Analyst at {org}")
            identity = self.add(Identity(f"per:{key[0]}:{key[1]}", "Person", primary, weight=6.0 if corporate else 2.5,
                                         company=anchor.call.company if corporate else None,
                                         descriptions=[description, f"{primary}, {'executive' if corporate else 'equity research analyst'}"]))
            identity.add(primary, "canonical")
            for name in names:
                if name != primary:
                    identity.add(name, "typo" if name == "Mark Moskowtiz" else "corpus")
            self._derive_person_variants(identity, primary)
            self.real_people[primary] = identity
            for name in names:
                self.real_people[name] = identity
        # Extra people: real first names and real surnames of the corpus, recombined.
        firsts = sorted({g[0] for g in (person_tokens(n)[0] for n in self.real_people) if g and len(g[0]) > 2 and "-" not in g[0]})
        lasts = sorted({person_tokens(n)[1] for n in self.real_people if len(person_tokens(n)[1]) > 1})
        per_surname = Counter(k[0] for k in used_keys)
        firms = sorted(i.canonical for i in self.identities.values() if i.cluster_id.startswith("org:firm:"))
        others = sorted(i.canonical for i in self.identities.values() if i.type == "Organization" and not i.cluster_id.startswith("org:firm:"))
        self.synthetic_people: list[Identity] = []
        attempts = 0
        while len(self.synthetic_people) < 600 and attempts < 50_000:
            attempts += 1
            first, last = self.rng.choice(firsts), self.rng.choice(lasts)
            key = (simple_fold(last), simple_fold(first)[:1])
            if key in used_keys or per_surname[key[0]] >= 3:
                continue
            used_keys.add(key)
            per_surname[key[0]] += 1
            middle = self.rng.choice("ABCDEFGHJKLMNPRSTW") if self.rng.random() < 0.5 else None
            full = f"{first} {middle}. {last}" if middle else f"{first} {last}"
            analyst = self.rng.random() < 0.6
            org = self.rng.choice(firms if analyst else others)
            identity = self.add(Identity(f"per:{key[0]}:{key[1]}", "Person", full, weight=1.0,
                                         descriptions=[f"Analyst at {org}" if analyst else f"Executive at {org}"]))
            identity.add(full, "canonical")
            self._derive_person_variants(identity, full)
            self.synthetic_people.append(identity)

    def _derive_person_variants(self, identity: Identity, full: str) -> None:
        given, last = person_tokens(full)
        if not given or not last:
            return
        first = given[0]
        if len(given) > 1 and len(first) > 1:
            identity.add(f"{first} {last}", "drop_middle")
            identity.add(f"{first} {given[1][0]}. {last}", "middle_initial")
        if len(given) > 1:
            identity.add("".join(f"{g[0]}." for g in given) + f" {last}", "initials")
        for nickname in NICKNAMES.get(first.lower(), [])[:1]:
            identity.add(f"{nickname} {last}", "nickname")
        if len(last) >= 5:
            position = 1 + int(hashlib.sha256(full.encode()).hexdigest(), 16) % (len(last) - 2)
            typo = last[:position] + last[position + 1] + last[position] + last[position + 2:]
            if typo != last:
                identity.add(" ".join([*given, typo]) if "." not in full else full.replace(last, typo), "typo")
        identity.variant_weight = {"canonical": 5, "corpus": 4, "drop_middle": 2, "middle_initial": 1, "nickname": 1.2,
                                   "initials": 0.4, "typo": 0.12}

    # --- offices ----------------------------------------------------------------------------

    def _build_offices(self) -> None:
        self.offices: dict[tuple[str, str], Identity] = {}  # (role, org cluster id) -> identity
        for ticker, company in sorted(self.registry.items()):
            org = self.identities[f"org:{ticker}"]
            org_forms = [(company.name, "canonical", 7), (self.short[ticker], "org_alias", 2)]
            org_forms += [(form, "org_suffix", 1) for form in LEGAL_FORMS.get(ticker, [])[:1]]
            for role in REGISTRY_ROLES:
                self._office(role, org, org_forms, weight=4.0 if role in FUNCTIONAL else 1.0, company=ticker)
        for identity in sorted((i for i in self.identities.values() if i.type == "Organization" and i.cluster_id.startswith("org:")
                                and not i.company), key=lambda i: i.cluster_id):
            firm = identity.cluster_id.startswith("org:firm:")
            forms = [(identity.canonical, "canonical", 7)]
            alt = sorted(s for s, k in identity.surfaces.items() if k in {"legal_suffix", "corpus"} and s != identity.canonical)
            if alt:
                forms.append((alt[0], "org_alias", 2))
            for role in (("Analyst",) if firm else ("CEO", "CFO")):
                self._office(role, identity, forms, weight=1.0)

    def _office(self, role: str, org: Identity, org_forms, weight: float, company: str | None = None) -> Identity:
        key = (role, org.cluster_id)
        identity = self.add(Identity(f"role:{role.lower().replace(' ', '_')}@{org.cluster_id[4:]}", "Role",
                                     f"{role} of {org.canonical}", weight=weight, company=company,
                                     descriptions=[f"The office of {role} at {org.canonical}"]))
        for form, kind, _ in org_forms:
            identity.add(f"{role} of {form}", kind)
        if role in LONG_ROLE:
            identity.add(f"{LONG_ROLE[role]} of {org_forms[0][0]}", "long_role")
        identity.variant_weight = {"canonical": 7, "org_alias": 2, "org_suffix": 1, "long_role": 0.8}
        self.offices[key] = identity
        return identity

    # --- metrics, guidance ------------------------------------------------------------------

    def _build_metrics(self) -> None:
        self.metrics: dict[tuple[str, str, str], Identity] = {}
        for ticker in sorted(self.registry):
            short, legal = self.short[ticker], self.registry[ticker].name
            company_calls = [c for c in self.calls if c.company == ticker]
            periods = sorted({c.fiscal_quarter for c in company_calls}, key=_period_sort)
            years = sorted({c.fiscal_year for c in company_calls})
            labels = periods + [f"FY{y}" for y in years]
            for metric in GENERIC_METRICS + COMPANY_METRICS.get(ticker, []):
                for label in labels:
                    self._metric(ticker, short, legal, metric, label)
            for metric in GUIDANCE_METRICS:
                for label in labels:
                    self._metric(ticker, short, legal, f"{metric} guidance", label, guidance=True)

    def _metric(self, ticker: str, short: str, legal: str, metric: str, label: str, guidance: bool = False) -> Identity:
        canonical = f"{short} {label} {metric}" if guidance else f"{short} {metric} {label}"
        identity = self.add(Identity(f"met:{ticker}:{simple_fold(metric).replace(' ', '_')}:{label.replace(' ', '')}", "Metric",
                                     canonical, company=ticker, weight=0.4 if guidance else 1.0,
                                     descriptions=[f"{legal}'s {metric} for {label}"]))
        identity.add(canonical, "canonical")
        identity.add(canonical.replace(short, legal, 1), "org_alias")
        identity.add(canonical.replace(short, ticker, 1), "ticker")
        if not guidance:
            identity.add(f"{short} {metric.title()} {label}", "case")
            identity.add(f"{short} {label} {metric}", "reordered")
        identity.variant_weight = {"canonical": 12, "org_alias": 2.5, "ticker": 0.5, "case": 0.8, "reordered": 0.8}
        self.metrics[(ticker, metric, label)] = identity
        return identity

    # --- numbers ----------------------------------------------------------------------------

    def _build_numbers(self) -> None:
        self.numbers: dict[str, Identity] = {}
        rng = random.Random(SEED + 1)
        values: set[tuple[str, str]] = set()
        while len(values) < 3000:
            roll = rng.random()
            if roll < 0.35:
                values.add(("billion", f"{rng.uniform(0.3, 70):.{rng.choice([1, 1, 2])}f}"))
            elif roll < 0.5:
                values.add(("million", f"{rng.randint(5, 990)}"))
            elif roll < 0.62:
                values.add(("eps", f"{rng.uniform(0.05, 4.5):.2f}"))
            elif roll < 0.92:
                values.add(("percent", f"{rng.uniform(0.1, 75):.{rng.choice([0, 1])}f}"))
            else:
                values.add(("bps", f"{rng.randint(1, 40) * 10}"))
        for unit, value in sorted(values) + [("billion", "15.8"), ("percent", "10"), ("percent", "100")]:
            self.number(unit, value)

    def number(self, unit: str, value: str) -> Identity:
        value = _number_text(unit, value)
        key = f"{unit}:{value}"
        if key in self.numbers:
            return self.numbers[key]
        forms = {
            "billion": [(f"${value} billion", "canonical"), (f"${value}B", "unit_abbrev"), (f"${value} bn", "unit_abbrev"),
                        (f"{value} billion dollars", "spelled")],
            "million": [(f"${value} million", "canonical"), (f"${value}M", "unit_abbrev"), (f"{value} million dollars", "spelled")],
            "eps": [(f"${value}", "canonical"), (f"{value} dollars per share", "spelled")],
            "percent": [(f"{value}%", "canonical"), (f"{value} percent", "spelled"), (f"{value} per cent", "spelled")],
            "bps": [(f"{value} basis points", "canonical"), (f"{value} bps", "unit_abbrev")],
        }[unit]
        identity = self.add(Identity(f"num:{key}", "Numeric", forms[0][0], weight=1.0, descriptions=["A reported figure"]))
        for surface, kind in forms:
            identity.add(surface, kind)
        identity.variant_weight = {"canonical": 8, "unit_abbrev": 1.5, "spelled": 1}
        self.numbers[key] = identity
        return identity

    # --- products, places, concepts ---------------------------------------------------------

    def _build_products(self) -> None:
        self.products: dict[str, list[Identity]] = defaultdict(list)
        for ticker, names in sorted(PRODUCTS.items()):
            owner = self.short.get(ticker, ticker)
            for name in names:
                identity = self.add(Identity(f"prd:{ticker}:{simple_fold(name).replace(' ', '_')}", "Product", name,
                                             company=ticker if ticker in self.registry else None,
                                             weight=3.0 if ticker in self.registry else 1.0,
                                             descriptions=[f"Product of {owner}"]))
                identity.add(name, "canonical")
                if not name.startswith(owner):
                    identity.add(f"{owner} {name}", "org_prefix")
                if name not in GENERIC_PRODUCTS:
                    identity.add(f"{name}\u00ae", "trademark")
                    identity.add(f"the {name}", "determiner")
                identity.variant_weight = {"canonical": 10, "org_prefix": 3, "trademark": 0.5, "determiner": 0.4}
                self.products[ticker].append(identity)

    def _build_places_and_concepts(self) -> None:
        self.places = self._simple_identities(PLACES, "loc", "Location", "A place named in an earnings call", ".")
        self.concepts = self._simple_identities(CONCEPTS, "oth", "Other", "A concept discussed in an earnings call", "-")

    def _simple_identities(self, entries, prefix: str, entity_type: str, description: str, separator: str) -> list[Identity]:
        """Identities with a canonical name and variants: all capitals (once `separator` is
        dropped, as in 'U.S.' or 'AI') make an acronym, anything else an alias."""
        identities = []
        for canonical, variants in entries:
            identity = self.add(Identity(f"{prefix}:{simple_fold(canonical).replace(' ', '_')}", entity_type, canonical,
                                         descriptions=[description]))
            identity.add(canonical, "canonical")
            for variant in variants:
                identity.add(variant, "acronym" if variant.replace(separator, "").isupper() else "alias")
            identity.variant_weight = {"canonical": 6, "alias": 2, "acronym": 2}
            identities.append(identity)
        return identities

    def _drop_ambiguous_surfaces(self) -> int:
        owners: dict[tuple[str, str], list[Identity]] = defaultdict(list)
        for identity in self.identities.values():
            for surface in identity.surfaces:
                owners[(identity.type, surface)].append(identity)
        dropped = 0
        for (_, surface), claimants in owners.items():
            if len(claimants) > 1:
                for identity in claimants:
                    if identity.surfaces.get(surface) == "canonical":
                        continue  # a canonical stays: the other identity loses the variant
                    del identity.surfaces[surface]
                    dropped += 1
        return dropped

    # --- lookups ----------------------------------------------------------------------------

    def surface_owner(self) -> dict[tuple[str, str], str]:
        return {(i.type, s): i.cluster_id for i in self.identities.values() for s in i.surfaces}

    def surface_owner_cached(self) -> dict[tuple[str, str], str]:
        if self._owner is None:
            self._owner = self.surface_owner()
        return self._owner

    def transient_number(self, unit: str, value: str) -> Identity:
        """A number for an event's triplet without adding it to the universe (generation of one
        data set must not change the universe another data set is drawn from)."""
        key = f"{unit}:{_number_text(unit, value)}"
        if key in self.numbers:
            return self.numbers[key]
        text = _number_text(unit, value)
        canonical = {"billion": f"${text} billion", "million": f"${text} million", "eps": f"${text}",
                     "percent": f"{text}%", "bps": f"{text} basis points"}[unit]
        return Identity(f"num:{key}", "Numeric", canonical)

    def pick_surface(self, identity: Identity, rng: random.Random) -> tuple[str, str]:
        surfaces = sorted(identity.surfaces.items())
        weights = [identity.variant_weight.get(kind, 1.0) for _, kind in surfaces]
        return rng.choices(surfaces, weights=weights)[0]


def _period_sort(label: str) -> tuple[int, int]:
    q, y = label.split()
    return int(y), int(q[1])


def firm_key(org: str) -> str:
    folded = simple_fold(org)
    folded = re.sub(r"\b(research division|research arm)\b", "", folded).strip()
    for prefix, key in FIRM_PREFIXES:
        if folded.startswith(prefix):
            return key
    return folded.split()[0]


# ------------------------------------------------------------------------------------------
# Mentions
# ------------------------------------------------------------------------------------------


@dataclass
class Mentions:
    table: pa.Table                # tkg.core.tables.ENTITIES
    truth: np.ndarray              # ground-truth cluster id per row, as integer codes
    truth_ids: list[str]           # code -> cluster id
    kinds: list[str]               # variant kind per row
    names: list[str]
    types: list[str]


def gold_alias_cases(path: Path = GOLD) -> list[dict]:
    import json

    if not path.exists():
        return []
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [c for c in cases if c.get("kind") == "alias"]


# Pairs reported on their own: they must resolve together (aliases) or apart (traps).
ALIAS_PROBES = [
    ("Person", "Chuck Robbins", "Charles H. Robbins"), ("Person", "R.J.M. Dassen", "Roger J. M. Dassen"),
    ("Person", "Tim Cook", "Timothy D. Cook"), ("Person", "Jensen Huang", "Jen-Hsun Huang"),
    ("Person", "Mark Moskowtiz", "Mark Moskowitz"), ("Person", "Toni Sacconaghi", "A.M. Sacconaghi"),
    ("Organization", "Intel Corp", "Intel Corporation"), ("Organization", "Intel", "Intel Corporation"),
    ("Organization", "AMD", "Advanced Micro Devices, Inc."), ("Organization", "INTC", "Intel Corporation"),
    ("Organization", "TSMC", "Taiwan Semiconductor Manufacturing Company"),
    ("Organization", "Bernstein", "Sanford C. Bernstein & Co., LLC., Research Division"),
    ("Organization", "BofA Merrill Lynch", "Bank of America Merrill Lynch"),
    ("Role", "CFO of Intel Corp.", "CFO of Intel Corporation"), ("Role", "Chief Financial Officer of Intel Corporation", "CFO of Intel Corporation"),
    ("Metric", "Intel Corporation revenue Q3 2016", "Intel revenue Q3 2016"), ("Metric", "Intel Q3 2016 revenue", "Intel revenue Q3 2016"),
    ("Product", "Intel Xeon", "Xeon"), ("Location", "U.S.", "United States"), ("Numeric", "$15.8B", "$15.8 billion"),
]
TRAP_PROBES = [
    ("Organization", "Micron", "Microsoft"), ("Organization", "Micron Technology, Inc.", "Microsoft Corporation"),
    ("Organization", "Apple", "Applied Materials"), ("Organization", "Apple Inc.", "Applied Materials, Inc."),
    ("Organization", "Micron Technology", "Microchip Technology"), ("Organization", "Intel", "Intelsat"),
    ("Organization", "Amazon", "Amazon Web Services"), ("Organization", "Samsung", "Samsung SDI"),
    ("Organization", "HP Inc.", "Hewlett Packard Enterprise"), ("Organization", "Alphabet Inc.", "Google"),
    ("Person", "Stacy Smith", "Stacy Rasgon"), ("Person", "Stacy Smith", "Douglas Smith"),
    ("Person", "Mark Moskowitz", "Gregg Moskowitz"), ("Person", "Mark May", "Mark Mahaney"),
    ("Person", "Patrick Ho", "Sidney Ho"), ("Person", "Devinder Kumar", "Harsh V. Kumar"),
    ("Role", "CEO of Intel Corporation", "CFO of Intel Corporation"),
    ("Role", "CFO of Micron Technology, Inc.", "CFO of Microsoft Corporation"),
    ("Metric", "Intel revenue Q3 2016", "Intel revenue Q4 2016"), ("Metric", "Micron revenue Q3 2017", "Microsoft revenue Q3 2017"),
    ("Numeric", "10%", "100%"), ("Product", "iPhone 7", "iPhone 8"), ("Product", "GeForce GTX 1080", "GeForce GTX 1070"),
    ("Location", "India", "Indiana"), ("Location", "Austria", "Australia"), ("Location", "China", "Greater China"),
]


def generate_mentions(n: int, universe: Universe | None = None, seed: int = SEED) -> Mentions:
    """`n` entity mentions (tkg.core.tables.ENTITIES rows) with ground truth, deterministic in (n, seed)."""
    universe = universe or get_universe()
    rng = random.Random(seed * 7 + n)
    calls = list(universe.calls)
    calls_by_company: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        calls_by_company[call.company].append(call)
    owner = universe.surface_owner()

    # Probe surfaces (gold aliases, alias and trap pairs) appear in every data set, 3 mentions each.
    forced: list[tuple[Identity, str, str]] = []
    probes = [("Person", c["a"], c["b"]) for c in gold_alias_cases()] + ALIAS_PROBES + TRAP_PROBES
    for entity_type, a, b in probes:
        for surface in (a, b):
            cluster = owner.get((entity_type, surface))
            if cluster is None:
                raise ValueError(f"probe surface {surface!r} ({entity_type}) is not in the universe")
            identity = universe.identities[cluster]
            forced += [(identity, surface, identity.surfaces[surface])] * 3
    forced = forced[: n // 4]

    type_counts = {t: round(share * (n - len(forced))) for t, share in TYPE_SHARE.items()}
    type_counts["Organization"] += (n - len(forced)) - sum(type_counts.values())
    picks: list[tuple[Identity, str, str]] = list(forced)
    for entity_type in TYPES:
        candidates = universe.by_type[entity_type]
        # Zipf-like popularity on top of each identity's base weight (a stable per-identity rank).
        weights = [c.weight / (1 + _stable_rank(c.cluster_id) % 97) ** 0.6 for c in candidates]
        for identity in rng.choices(candidates, weights=weights, k=type_counts.get(entity_type, 0)):
            surface, kind = universe.pick_surface(identity, rng)
            picks.append((identity, surface, kind))
    rng.shuffle(picks)

    descriptions = [rng.choice(identity.descriptions) for identity, _, _ in picks]
    unique_descriptions = sorted(set(descriptions))
    from tkg.core.embeddings import WordLlamaEmbedder

    description_vectors = WordLlamaEmbedder().embed(unique_descriptions)
    description_index = {text: i for i, text in enumerate(unique_descriptions)}
    columns: dict[str, list] = defaultdict(list)
    truth_codes, truth_ids, code_of = [], [], {}
    for index, ((identity, surface, kind), description) in enumerate(zip(picks, descriptions)):
        company_calls = calls_by_company.get(identity.company or "") or calls
        call = rng.choice(company_calls)
        columns["entity_id"].append(f"m{index:07d}")
        columns["event_id"].append(f"s{index // 2:07d}")
        columns["company"].append(call.company)
        columns["quarter"].append(date(call.call_date.year, 3 * ((call.call_date.month - 1) // 3) + 1, 1))
        columns["name"].append(surface)
        columns["type"].append(identity.type)
        columns["description"].append(description)
        columns["seen_at"].append(call.call_datetime)
        if identity.cluster_id not in code_of:
            code_of[identity.cluster_id] = len(truth_ids)
            truth_ids.append(identity.cluster_id)
        truth_codes.append(code_of[identity.cluster_id])
    vectors = description_vectors[[description_index[d] for d in descriptions]]
    arrays = []
    for column in tables.ENTITIES:
        if column.name == "embedding":
            flat = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])
            arrays.append(flat.cast(column.type))
        else:
            arrays.append(pa.array(columns[column.name], type=column.type))
    table = pa.Table.from_arrays(arrays, schema=tables.ENTITIES)
    return Mentions(table, np.asarray(truth_codes, dtype=np.int64), truth_ids,
                    [k for _, _, k in picks], [s for _, s, _ in picks], [i.type for i, _, _ in picks])


def _stable_rank(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


# ------------------------------------------------------------------------------------------
# Events
# ------------------------------------------------------------------------------------------


@dataclass
class Events:
    events: pa.Table               # tkg.core.tables.EVENTS
    triplets: pa.Table             # resolved triplets (the schema of sql/triplets.sql)
    expected: dict[str, tuple[datetime, set[str]]]  # event_id -> (invalid_at, event ids that retire it at that date)
    counts: Counter
    embed_seconds: float


def _utc(day: date) -> datetime:
    return datetime.combine(day, time(0, 0), tzinfo=UTC)


def _officers_by_call(universe: Universe) -> dict[Call, list[tuple[str, Identity]]]:
    """The functional offices each call's corporate participants hold (from their real titles)."""
    holders: dict[Call, list[tuple[str, Identity]]] = defaultdict(list)
    for p in universe.participants:
        if p.kind != "corporate":
            continue
        person = universe.real_people.get(p.name)
        if person is None:
            continue
        title = p.title
        roles = []
        if re.search(r"\bCEO\b", title) and not re.search(r"\bInterim CEO\b", title):
            roles.append("CEO")
        if re.search(r"\bInterim CEO\b", title):
            roles.append("CEO")
        if re.search(r"\bCFO\b", title):
            roles.append("CFO")
        if re.search(r"\bPresident\b", title) and "Group President" not in title:
            roles.append("President")
        if re.search(r"\bChairman\b", title) and "Management Board" not in title:
            roles.append("Chairman")
        if re.search(r"\bIR\b|Investor Relations", title):
            roles.append("VP of IR")
        for role in roles:
            if (role, person) not in holders[p.call]:
                holders[p.call].append((role, person))
    return holders


def _other_company_officers(universe: Universe, rng: random.Random) -> dict[str, list[tuple[date, Identity]]]:
    """Synthetic CEO/CFO timelines for the other real companies: 1-3 holders over 2016-2020."""
    executives = [p for p in universe.synthetic_people if p.descriptions[0].startswith("Executive at ")]
    timelines: dict[str, list[tuple[date, Identity]]] = {}
    pool = list(executives)
    rng.shuffle(pool)
    for (role, org_id), office in sorted(universe.offices.items()):
        if office.company or role not in {"CEO", "CFO"} or not pool:
            continue
        holders = []
        start = date(2014, 1, 1) + timedelta(days=rng.randint(0, 700))
        for _ in range(rng.choice([1, 2, 2, 3])):
            if not pool:
                break
            holders.append((start, pool.pop()))
            start = start + timedelta(days=rng.randint(300, 1100))
            if start > date(2020, 9, 30):
                break
        timelines[office.cluster_id] = holders
    return timelines


TEMPLATE_WEIGHTS = {
    "officer": 0.04, "analyst": 0.04, "other_officer": 0.025, "guidance": 0.07, "revenue": 0.12, "change": 0.10,
    "restated_result": 0.06, "sells": 0.06, "supplies": 0.03, "discontinued": 0.01, "launched": 0.04,
    "collaborates": 0.04, "invests": 0.02, "adopted": 0.02, "located": 0.01, "has_a": 0.02, "is_a": 0.01,
    "opinion": 0.12, "prediction": 0.12, "atemporal": 0.05,
}


def generate_events(n: int, universe: Universe | None = None, seed: int = SEED) -> Events:
    """`n` temporal events over the 188 real calls, with their canonical triplets."""
    import time as clock

    universe = universe or get_universe()
    rng = random.Random(seed * 13 + n)
    calls = list(universe.calls)
    officers = _officers_by_call(universe)
    other_timelines = _other_company_officers(universe, random.Random(seed + 5))
    other_offices = sorted(other_timelines)
    analysts_by_call: dict[Call, list[tuple[RealParticipant, Identity]]] = defaultdict(list)
    for p in universe.participants:
        if p.kind == "conference" and p.name in universe.real_people:
            analysts_by_call[p.call].append((p, universe.real_people[p.name]))
    orgs = [i for i in universe.by_type["Organization"] if not i.company and not i.cluster_id.startswith("org:firm:")]
    guidance_values: dict[str, str] = {}

    per_call = [n // len(calls) + (1 if i < n % len(calls) else 0) for i in range(len(calls))]
    templates, weights = zip(*TEMPLATE_WEIGHTS.items())
    events, triplets, asserts = [], [], {}
    counts: Counter = Counter()
    for call_index, (call, budget) in enumerate(zip(calls, per_call)):
        ticker, legal, short = call.company, universe.registry[call.company].name, universe.short[call.company]
        company = universe.identities[f"org:{ticker}"]
        created = call.call_datetime
        publication = _utc(call.call_date)
        period_end = _utc(call.period_end)
        call_labels = sorted({c.fiscal_quarter for c in calls if c.company == ticker and c.call_date <= call.call_date}, key=_period_sort)
        for slot in range(budget):
            template = rng.choices(templates, weights=weights)[0]
            event_id = f"e{call_index:03d}{slot:05d}"
            built = _build_event(template, universe, rng, call, company, legal, short, call_labels, publication, period_end,
                                 officers.get(call, []), analysts_by_call.get(call, []), other_timelines, other_offices, orgs,
                                 guidance_values)
            statement, statement_type, temporal_type, valid_at, invalid_at, spo, assertion = built
            counts[f"template:{template}"] += 1
            counts[f"{statement_type}/{temporal_type}"] += 1
            events.append({
                "event_id": event_id, "chunk_id": f"c{call_index:03d}{slot // 8:04d}",
                "transcript_id": f"{ticker}_{call.call_date:%Y%m%d}", "company": ticker,
                "quarter": date(call.call_date.year, 3 * ((call.call_date.month - 1) // 3) + 1, 1),
                "statement": statement, "statement_hash": hashlib.sha256(statement.encode()).hexdigest()[:16],
                "statement_type": statement_type, "temporal_type": temporal_type, "valid_at": valid_at,
                "invalid_at": invalid_at, "created_at": created,
                "expired_at": created if (temporal_type == "DYNAMIC" and invalid_at is not None) else None,
                "ingested_at": created, "embedding": None,
            })
            for position, (subject, predicate, obj, value) in enumerate(spo):
                triplets.append({
                    "triplet_id": f"t{event_id[1:]}{position}", "event_id": event_id, "company": ticker,
                    "quarter": events[-1]["quarter"], "subject_id": subject.cluster_id, "subject": subject.canonical,
                    "subject_mention": subject.canonical, "predicate": predicate,
                    "object_id": obj.cluster_id if obj else None, "object": obj.canonical if obj else value,
                    "object_mention": obj.canonical if obj else value, "value": value,
                })
            if assertion:
                asserts[event_id] = assertion

    start = clock.perf_counter()
    from tkg.core.embeddings import WordLlamaEmbedder

    vectors = WordLlamaEmbedder().embed([e["statement"] for e in events])
    embed_seconds = clock.perf_counter() - start
    for event, vector in zip(events, vectors):
        event["embedding"] = vector
    event_table = pa.Table.from_pylist([{**e, "embedding": None} for e in events], schema=tables.EVENTS)
    embedding_column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])
    event_table = event_table.set_column(event_table.schema.get_field_index("embedding"), "embedding",
                                         embedding_column.cast(tables.EMBEDDING))
    triplet_table = pa.Table.from_pylist(triplets, schema=RESOLVED_TRIPLETS)
    expected = expected_invalidations(events, asserts)
    counts["events"] = len(events)
    counts["triplets"] = len(triplets)
    counts["expected_invalidations"] = len(expected)
    return Events(event_table, triplet_table, expected, counts, embed_seconds)


RESOLVED_TRIPLETS = pa.schema([
    ("triplet_id", pa.string()), ("event_id", pa.string()), ("company", pa.string()), ("quarter", pa.date32()),
    ("subject_id", pa.string()), ("subject", pa.string()), ("subject_mention", pa.string()), ("predicate", pa.string()),
    ("object_id", pa.string()), ("object", pa.string()), ("object_mention", pa.string()), ("value", pa.string()),
])


def _money(rng: random.Random, low: float, high: float) -> str:
    return f"${rng.uniform(low, high):.1f} billion"


def _build_event(template, u: Universe, rng, call: Call, company: Identity, legal, short, labels, publication, period_end,
                 officers, analysts, other_timelines, other_offices, orgs, guidance_values):
    """One statement: (text, statement_type, temporal_type, valid_at, invalid_at, triplets, assertion)."""
    ticker = call.company
    label = call.fiscal_quarter
    fact, dynamic, static = "FACT", "DYNAMIC", "STATIC"
    if template == "officer" and officers:
        role, person = rng.choice(officers)
        office = u.offices[(role, company.cluster_id)]
        text = rng.choice(["{p} is the {r} of {c}.", "{p} serves as {r} of {c}.", "{c}'s {r} is {p}."]).format(p=person.canonical, r=role, c=legal)
        assertion = ("office", office.cluster_id, person.cluster_id) if role in FUNCTIONAL else None
        return text, fact, dynamic, publication, None, [(person, "HOLDS_ROLE", office, role)], assertion
    if template == "analyst" and analysts:
        participant, person = rng.choice(analysts)
        firm_id = u.surface_owner_cached().get(("Organization", participant.organization))
        firm = u.identities.get(firm_id) if firm_id else None
        office = u.offices.get(("Analyst", firm.cluster_id)) if firm else None
        if office is not None:
            text = f"{person.canonical} is an analyst at {firm.canonical}."
            return text, fact, dynamic, publication, None, [(person, "HOLDS_ROLE", office, "Analyst")], None
        template = "sells"
    if template in ("officer", "other_officer", "analyst"):
        office_id = rng.choice(other_offices)
        holders = [(start, person) for start, person in other_timelines[office_id] if start <= call.call_date]
        if not holders:
            holders = other_timelines[office_id][:1]
        start, person = holders[-1]
        office = u.identities[office_id]
        appointment = rng.random() < 0.3
        role = office.canonical.split(" of ")[0]
        org = office.canonical.split(" of ", 1)[1]
        if appointment:
            text = f"{person.canonical} became {role} of {org} on {start:%B %d, %Y}."
            valid_at = _utc(start)
        else:
            text = f"{person.canonical} is the {role} of {org}."
            valid_at = publication
        return text, fact, dynamic, valid_at, None, [(person, "HOLDS_ROLE", office, role)], ("office", office_id, person.cluster_id)
    if template == "guidance":
        metric = rng.choice(GUIDANCE_METRICS)
        future = [l for l in _next_labels(label, 2)] + [f"FY{call.fiscal_year}", f"FY{call.fiscal_year + 1}"]
        target_label = rng.choice(future)
        target = u.metrics.get((ticker, f"{metric} guidance", target_label))
        if target is None:
            target = u.metrics[(ticker, f"{metric} guidance", f"FY{call.fiscal_year}")]
            target_label = f"FY{call.fiscal_year}"
        key = target.cluster_id
        # One value per target per call; from one call to the next it is revised 45% of the time.
        seen_call, value = guidance_values.get(key, (None, None))
        if value is None or (seen_call != call and rng.random() < 0.45):
            value = _money(rng, 1, 60) if metric != "gross margin" else f"{rng.randint(30, 70)}%"
        guidance_values[key] = (call, value)
        number = u.transient_number("percent", value[:-1]) if value.endswith("%") else None
        text = f"{legal}'s {target_label} {metric} guidance is {value}."
        invalid_at = None
        if rng.random() < 0.15:
            invalid_at = _label_end(u, ticker, target_label) or None
            if invalid_at is not None and invalid_at <= publication:
                invalid_at = None
        spo = [(company, "TARGETS", target, value)]
        if number is not None and rng.random() < 0.3:
            spo.append((target, "HAS_A", number, None))
        return text, fact, dynamic, publication, invalid_at, spo, ("guidance", key, _measure(value), value)
    if template in ("revenue", "change", "restated_result"):
        metric = rng.choice(GENERIC_METRICS[:6] + COMPANY_METRICS.get(ticker, []))
        result_label = label if template != "restated_result" else rng.choice(labels[-6:])
        target = u.metrics.get((ticker, metric, result_label)) or u.metrics[(ticker, metric, label)]
        valid_at = _label_end(u, ticker, result_label) or period_end
        if template == "change":
            pct = f"{rng.uniform(0.5, 40):.1f}"
            number = u.transient_number("percent", pct)
            up = rng.random() < 0.6
            text = f"{legal}'s {metric} {'increased' if up else 'decreased'} {pct}% year over year in {result_label}."
            return text, fact, static, valid_at, None, [(company, "INCREASED" if up else "DECREASED", target, f"{pct}%")], None
        value = _stable_value(target.cluster_id)
        number = u.transient_number("billion", value)
        text = rng.choice(["{c} reported {m} of ${v} billion for {l}.", "{c}'s {m} for {l} was ${v} billion.",
                           "In {l}, {c} generated {m} of ${v} billion."]).format(c=legal, m=metric, v=value, l=result_label)
        spo = [(company, "HAS_REVENUE", target, f"${value} billion")]
        if rng.random() < 0.3:
            spo.append((target, "HAS_A", number, None))
        return text, fact, static, valid_at, None, spo, None
    if template in ("sells", "discontinued", "launched", "adopted"):
        products = u.products.get(ticker) or u.products["INTC"]
        product = rng.choice(products)
        if template == "sells":
            verb = rng.choice(["sells", "produces"])
            return (f"{legal} {verb} {product.canonical}.", fact, dynamic, publication, None,
                    [(company, verb.upper(), product, None)], None)
        if template == "discontinued":
            return (f"{legal} discontinued {product.canonical} in {label}.", fact, static, period_end, None,
                    [(company, "DISCONTINUED", product, None)], None)
        if template == "launched":
            return (f"{legal} launched {product.canonical} in {label}.", fact, static, period_end, None,
                    [(company, "LAUNCHED", product, None)], None)
        partner = rng.choice(orgs)
        return (f"{product.canonical} has been adopted by {partner.canonical}.", fact, dynamic, publication, None,
                [(product, "ADOPTED_BY", partner, None)], None)
    if template in ("supplies", "collaborates", "invests"):
        partner = rng.choice(orgs)
        if template == "supplies":
            return (f"{partner.canonical} supplies {legal}.", fact, dynamic, publication, None, [(partner, "SUPPLIES", company, None)], None)
        if template == "collaborates":
            return (f"{legal} collaborates with {partner.canonical} on data center platforms.", fact, dynamic, publication, None,
                    [(company, "COLLABORATES_WITH", partner, None)], None)
        amount = u.transient_number("million", str(rng.randint(5, 990)))
        return (f"{legal} invested {amount.canonical} in {partner.canonical} in {label}.", fact, static, period_end, None,
                [(company, "INVESTS_IN", partner, amount.canonical)], None)
    if template == "located":
        place = u.identities.get(f"loc:{simple_fold(HEADQUARTERS[ticker]).replace(' ', '_')}")
        return (f"{legal} is headquartered in {place.canonical}.", fact, dynamic, publication, None,
                [(company, "LOCATED_IN", place, None)], None)
    if template == "has_a":
        count = u.transient_number("million", str(rng.randint(5, 990)))
        return (f"{legal} has {count.canonical.replace('$', '')} active customers.", fact, dynamic, publication, None,
                [(company, "HAS_A", count, None)], None)
    if template == "is_a":
        concept = rng.choice(u.concepts)
        return (f"{legal} is a leader in {concept.canonical}.", fact, dynamic, publication, None,
                [(company, "IS_A", concept, None)], None)
    if template == "opinion":
        product = rng.choice(u.products.get(ticker) or u.products["INTC"])
        return (f"{legal} believes demand for {product.canonical} remains strong.", "OPINION", static, publication, None,
                [(company, "SELLS", product, None)], None)
    if template == "prediction":
        metric = rng.choice(GENERIC_METRICS[:4])
        nxt = _next_labels(label, 1)[0]
        target = u.metrics.get((ticker, metric, nxt)) or u.metrics[(ticker, metric, label)]
        return (f"{legal} expects {metric} to grow in {nxt}.", "PREDICTION", dynamic, publication, None,
                [(company, "TARGETS", target, None)], None)
    concept = rng.choice(u.concepts)
    return (f"{concept.canonical} drives demand for computing.", fact, "ATEMPORAL", None, None,
            [(concept, "RESULTED_IN", company, None)], None)


def _measure(value: str) -> str:
    return "money" if "$" in value else "percent" if "%" in value else "other"


def _stable_value(key: str) -> str:
    return f"{1 + _stable_rank(key) % 600 / 10:.1f}"


def _next_labels(label: str, count: int) -> list[str]:
    q, y = int(label.split()[0][1]), int(label.split()[1])
    out = []
    for _ in range(count):
        q, y = (1, y + 1) if q == 4 else (q + 1, y)
        out.append(f"Q{q} {y}")
    return out


def _label_end(u: Universe, ticker: str, label: str) -> datetime | None:
    company = u.registry[ticker]
    if label.startswith("FY"):
        _, end = company.fiscal_period(4, int(label[2:]))
    else:
        _, end = company.fiscal_period(int(label[1]), int(label.split()[1]))
    return _utc(end)


def expected_invalidations(events: list[dict], asserts: dict[str, tuple]) -> dict[str, tuple[datetime, set[str]]]:
    """What a correct pipeline retires: an open DYNAMIC FACT whose functional office gets another
    holder, or whose guidance target gets a different value of the same measure, later; the
    earliest such event sets invalid_at (REFERENCE 1.8)."""
    by_id = {e["event_id"]: e for e in events}
    groups: dict[tuple, list[str]] = defaultdict(list)
    for event_id, assertion in asserts.items():
        event = by_id[event_id]
        if event["statement_type"] != "FACT" or event["temporal_type"] != "DYNAMIC" or event["valid_at"] is None:
            continue
        groups[assertion[:2]].append(event_id)
    expected: dict[str, tuple[datetime, set[str]]] = {}
    for ids in groups.values():
        ids.sort(key=lambda i: (by_id[i]["valid_at"], i))
        for event_id in ids:
            primary, mine = by_id[event_id], asserts[event_id]
            retirers = [o for o in ids if by_id[o]["valid_at"] > primary["valid_at"] and _contradicts(mine, asserts[o])]
            if not retirers:
                continue
            first = min(by_id[o]["valid_at"] for o in retirers)
            if primary["invalid_at"] is not None and first >= primary["invalid_at"]:
                continue
            expected[event_id] = (first, {o for o in retirers if by_id[o]["valid_at"] == first})
    return expected


def _contradicts(old: tuple, new: tuple) -> bool:
    if old[0] == "office":
        return old[2] != new[2]
    return old[2] == new[2] and old[3] != new[3]


# ------------------------------------------------------------------------------------------
# Curated real-world names (public companies, products, places; no invented entities)
# ------------------------------------------------------------------------------------------

SHORT_NAMES = {"AAPL": "Apple", "AMD": "AMD", "AMZN": "Amazon", "ASML": "ASML", "CSCO": "Cisco", "GOOGL": "Alphabet",
               "INTC": "Intel", "MSFT": "Microsoft", "MU": "Micron", "NVDA": "NVIDIA"}
REGISTRY_DESCRIPTIONS = {
    "AAPL": ["Consumer electronics company that makes the iPhone", "Apple, maker of iPhone, Mac and services"],
    "AMD": ["Semiconductor company making CPUs and GPUs", "Chipmaker behind Ryzen and EPYC processors"],
    "AMZN": ["E-commerce and cloud computing company", "Online retailer and operator of AWS"],
    "ASML": ["Dutch maker of lithography systems for chipmakers", "Supplier of EUV lithography machines"],
    "CSCO": ["Networking equipment company", "Maker of routers, switches and collaboration software"],
    "GOOGL": ["Parent company of Google", "Holding company of Google, YouTube and Waymo"],
    "INTC": ["Semiconductor company making x86 processors", "Chipmaker behind Xeon and Core processors"],
    "MSFT": ["Software and cloud company", "Maker of Windows, Office and Azure"],
    "MU": ["Memory chip maker (DRAM and NAND)", "Semiconductor company making memory and storage"],
    "NVDA": ["Graphics processor company", "Chipmaker behind GeForce GPUs and data center accelerators"],
}
# Real legal-name spellings besides the registry's ('Intel Corp.', 'Apple Inc' without the dot).
LEGAL_FORMS = {
    "AAPL": ["Apple Inc", "Apple, Inc."], "AMD": ["Advanced Micro Devices Inc."], "AMZN": ["Amazon.com Inc."],
    "ASML": ["ASML Holding NV", "ASML N.V."], "CSCO": ["Cisco Systems Inc.", "Cisco Systems"], "GOOGL": ["Alphabet, Inc."],
    "INTC": ["Intel Corp."], "MSFT": ["Microsoft Corp.", "Microsoft Corp"], "MU": ["Micron Technology Inc.", "Micron Technology Inc"],
    "NVDA": ["NVIDIA Corp.", "Nvidia Corporation", "Nvidia"],
}
GENERIC_PRODUCTS = {"DRAM", "NAND", "3D NAND", "GDDR6", "LPDDR4", "DUV immersion", "Mac", "Prime"}
HEADQUARTERS = {"AAPL": "Cupertino", "AMD": "Santa Clara", "AMZN": "Seattle", "ASML": "Veldhoven", "CSCO": "San Jose",
                "GOOGL": "Mountain View", "INTC": "Santa Clara", "MSFT": "Redmond", "MU": "Boise", "NVDA": "Santa Clara"}
FUNCTIONAL = {"CEO", "CFO", "COO", "CTO", "President", "Chairman"}
REGISTRY_ROLES = ["CEO", "CFO", "COO", "CTO", "President", "Chairman", "EVP", "SVP", "Treasurer", "VP of IR",
                  "General Counsel"]
LONG_ROLE = {"CEO": "Chief Executive Officer", "CFO": "Chief Financial Officer", "COO": "Chief Operating Officer",
             "CTO": "Chief Technology Officer"}
GENERIC_METRICS = ["revenue", "gross margin", "operating margin", "operating income", "net income", "earnings per share",
                   "free cash flow", "operating expenses", "capital expenditures", "R&D expenses"]
GUIDANCE_METRICS = ["revenue", "gross margin", "capital expenditures"]
COMPANY_METRICS = {
    "INTC": ["data center group revenue", "client computing group revenue", "IoT group revenue"],
    "NVDA": ["gaming revenue", "data center revenue", "automotive revenue"],
    "AMD": ["computing and graphics revenue", "enterprise, embedded and semi-custom revenue"],
    "MU": ["DRAM revenue", "NAND revenue", "DRAM bit shipments"],
    "AAPL": ["iPhone revenue", "services revenue", "Mac revenue", "iPad revenue", "wearables revenue"],
    "MSFT": ["Azure revenue growth", "commercial cloud revenue", "LinkedIn revenue"],
    "GOOGL": ["advertising revenue", "Google Cloud revenue", "YouTube ads revenue"],
    "AMZN": ["AWS revenue", "North America segment revenue", "subscription services revenue"],
    "CSCO": ["product revenue", "service revenue", "deferred revenue"],
    "ASML": ["net bookings", "EUV revenue", "installed base management sales"],
}
FIRM_PREFIXES = [
    ("bofa", "bofa"), ("bank of america", "bofa"), ("sanford c bernstein", "bernstein"), ("bernstein", "bernstein"),
    ("summit redstone", "redstone"), ("redstone", "redstone"), ("sig", "susquehanna"), ("susquehanna", "susquehanna"),
    ("joh berenberg", "berenberg"), ("robert w baird", "baird"), ("baird", "baird"), ("jp morgan", "jpmorgan"),
    ("jpmorgan", "jpmorgan"), ("b riley", "briley"), ("societe generale", "socgen"), ("d a davidson", "davidson"),
    ("new street", "newstreet"), ("pacific crest", "pacificcrest"), ("wells fargo", "wellsfargo"),
    ("william blair", "williamblair"), ("morgan stanley", "morganstanley"), ("goldman sachs", "goldman"),
    ("raymond james", "raymondjames"), ("deutsche bank", "deutsche"), ("credit suisse", "creditsuisse"),
    ("cleveland research", "cleveland"), ("cross research", "crossresearch"), ("drexel hamilton", "drexel"),
    ("piper", "piper"), ("exane", "exane"), ("agency partners", "agency"), ("arete", "arete"), ("google", "google"),
]
# (canonical, variants, description, base weight): real companies the ten talk about.
OTHER_COMPANIES = [
    ("Applied Materials", ["Applied Materials, Inc.", "AMAT"], "Semiconductor equipment maker", 2.0),
    ("Microchip Technology", ["Microchip Technology Inc.", "Microchip"], "Microcontroller maker", 1.0),
    ("Intelsat", ["Intelsat S.A."], "Satellite operator", 0.6),
    ("Amazon Web Services", ["AWS", "Amazon Web Services, Inc."], "Cloud computing subsidiary of Amazon", 2.0),
    ("Samsung Electronics", ["Samsung", "Samsung Electronics Co., Ltd."], "Korean electronics and memory maker", 3.0),
    ("Samsung SDI", ["Samsung SDI Co., Ltd."], "Korean battery maker", 0.6),
    ("HP Inc.", ["HP", "Hewlett-Packard"], "PC and printer maker", 1.5),
    ("Hewlett Packard Enterprise", ["HPE", "Hewlett Packard Enterprise Company"], "Enterprise server and storage company", 1.5),
    ("Google", ["Google Inc.", "Google LLC"], "Search and advertising company, a subsidiary of Alphabet", 3.0),
    ("Taiwan Semiconductor Manufacturing Company", ["TSMC", "Taiwan Semiconductor", "Taiwan Semiconductor Manufacturing Co., Ltd."],
     "Contract chip manufacturer", 2.5),
    ("International Business Machines", ["IBM", "IBM Corporation"], "IT services and hardware company", 1.5),
    ("Qualcomm", ["Qualcomm Incorporated", "QUALCOMM"], "Mobile chip maker", 2.0),
    ("Broadcom", ["Broadcom Inc.", "Broadcom Limited"], "Semiconductor and infrastructure software company", 1.5),
    ("Texas Instruments", ["Texas Instruments Incorporated", "TI"], "Analog chip maker", 1.0),
    ("SK Hynix", ["SK hynix Inc.", "Hynix"], "Korean memory maker", 1.5),
    ("Western Digital", ["Western Digital Corporation", "WDC"], "Storage company", 1.0),
    ("Seagate Technology", ["Seagate"], "Hard disk drive maker", 1.0),
    ("Dell Technologies", ["Dell", "Dell Inc."], "PC and server maker", 2.0),
    ("Lenovo", ["Lenovo Group", "Lenovo Group Limited"], "PC maker", 1.5),
    ("Foxconn", ["Hon Hai Precision Industry", "Hon Hai"], "Electronics contract manufacturer", 1.0),
    ("Arm Holdings", ["Arm", "ARM Holdings plc", "Arm Limited"], "Processor architecture licensor", 1.5),
    ("Marvell Technology", ["Marvell", "Marvell Technology Group"], "Semiconductor company", 0.8),
    ("Xilinx", ["Xilinx, Inc."], "FPGA maker", 1.0),
    ("Lam Research", ["Lam Research Corporation", "Lam"], "Semiconductor equipment maker", 1.0),
    ("KLA-Tencor", ["KLA", "KLA Corporation"], "Process control equipment maker", 0.8),
    ("Tokyo Electron", ["Tokyo Electron Limited", "TEL"], "Semiconductor equipment maker", 0.8),
    ("Carl Zeiss", ["Zeiss", "Carl Zeiss SMT"], "Optics supplier of ASML", 1.0),
    ("Mobileye", ["Mobileye N.V."], "Driver-assistance chip company acquired by Intel", 1.0),
    ("Altera", ["Altera Corporation"], "FPGA maker acquired by Intel", 0.8),
    ("Mellanox Technologies", ["Mellanox"], "Interconnect company acquired by NVIDIA", 1.0),
    ("Arista Networks", ["Arista", "Arista Networks, Inc."], "Data center networking company", 1.0),
    ("Juniper Networks", ["Juniper", "Juniper Networks, Inc."], "Networking equipment company", 1.0),
    ("VMware", ["VMware, Inc."], "Virtualisation software company", 1.0),
    ("Red Hat", ["Red Hat, Inc."], "Open source software company", 0.8),
    ("LinkedIn", ["LinkedIn Corporation"], "Professional network acquired by Microsoft", 1.0),
    ("GitHub", ["GitHub, Inc."], "Code hosting platform acquired by Microsoft", 0.6),
    ("Whole Foods Market", ["Whole Foods"], "Grocer acquired by Amazon", 0.8),
    ("YouTube", ["YouTube LLC"], "Video platform owned by Google", 1.2),
    ("Waymo", ["Waymo LLC"], "Self-driving company of Alphabet", 0.8),
    ("Verizon Communications", ["Verizon"], "US telecom operator", 1.0),
    ("AT&T", ["AT&T Inc."], "US telecom operator", 1.0),
    ("T-Mobile US", ["T-Mobile"], "US telecom operator", 0.6),
    ("Ericsson", ["Telefonaktiebolaget LM Ericsson"], "Telecom equipment maker", 0.6),
    ("Nokia", ["Nokia Corporation"], "Telecom equipment maker", 0.6),
    ("Huawei", ["Huawei Technologies"], "Chinese telecom equipment and phone maker", 1.2),
    ("Tencent", ["Tencent Holdings"], "Chinese internet company", 0.8),
    ("Alibaba", ["Alibaba Group", "Alibaba Group Holding"], "Chinese e-commerce and cloud company", 1.0),
    ("Baidu", ["Baidu, Inc."], "Chinese search company", 0.8),
    ("Facebook", ["Facebook, Inc."], "Social network", 1.2),
    ("Oracle", ["Oracle Corporation"], "Database and cloud company", 1.0),
    ("Salesforce", ["salesforce.com", "Salesforce.com, Inc."], "CRM software company", 0.8),
    ("Tesla", ["Tesla, Inc.", "Tesla Motors"], "Electric car maker", 0.8),
    ("Sony", ["Sony Corporation"], "Consumer electronics and gaming company", 1.0),
    ("Nintendo", ["Nintendo Co., Ltd."], "Game console maker", 0.8),
    ("Applied Micro Circuits", ["Applied Micro Circuits Corporation", "AppliedMicro"], "Networking chip company", 0.4),
]
PRODUCTS = {
    "INTC": ["Xeon", "Xeon Scalable", "Core i7", "Core i5", "Optane", "3D XPoint", "Movidius", "Nervana", "Stratix 10"],
    "NVDA": ["GeForce", "GeForce GTX 1080", "GeForce GTX 1070", "Tesla V100", "DRIVE PX", "Quadro", "CUDA", "Tegra"],
    "AMD": ["Ryzen", "Ryzen 7", "Ryzen 5", "EPYC", "Radeon", "Radeon Instinct", "Threadripper"],
    "AAPL": ["iPhone", "iPhone 7", "iPhone 8", "iPhone X", "iPad", "Mac", "Apple Watch", "AirPods", "Apple Music"],
    "MSFT": ["Azure", "Office 365", "Windows 10", "Xbox One", "Surface", "Dynamics 365", "Teams"],
    "GOOGL": ["Google Cloud Platform", "Android", "Pixel", "Google Assistant", "G Suite", "Chrome"],
    "AMZN": ["Alexa", "Echo", "Prime", "Kindle", "Fire TV", "Prime Video"],
    "CSCO": ["Webex", "Meraki", "Catalyst 9000", "Nexus", "Umbrella", "Duo"],
    "ASML": ["TWINSCAN NXE:3400B", "TWINSCAN NXE:3350B", "HMI eScan", "YieldStar", "DUV immersion"],
    "MU": ["DRAM", "NAND", "GDDR6", "3D NAND", "LPDDR4"],
}
PLACES = [
    ("United States", ["U.S.", "USA", "the United States"]), ("China", ["mainland China", "PRC"]), ("Greater China", []),
    ("Japan", []), ("Taiwan", []), ("South Korea", ["Korea"]), ("Israel", []), ("India", []), ("Indiana", []),
    ("Austria", []), ("Australia", []), ("Ireland", ["Republic of Ireland"]), ("Germany", []), ("Netherlands", ["the Netherlands", "Holland"]),
    ("Europe", []), ("Santa Clara", ["Santa Clara, California", "Santa Clara, CA"]), ("Cupertino", ["Cupertino, California"]),
    ("Seattle", ["Seattle, Washington"]), ("Veldhoven", ["Veldhoven, the Netherlands"]), ("San Jose", ["San Jose, California"]),
    ("Mountain View", ["Mountain View, California"]), ("Redmond", ["Redmond, Washington"]), ("Boise", ["Boise, Idaho"]),
    ("Chandler", ["Chandler, Arizona"]), ("Hillsboro", ["Hillsboro, Oregon"]), ("Virginia", []), ("West Virginia", []),
    ("Singapore", []), ("Malaysia", []), ("Vietnam", []), ("Mexico", []), ("Brazil", []), ("United Kingdom", ["U.K.", "UK"]),
]
CONCEPTS = [
    ("artificial intelligence", ["AI"]), ("machine learning", ["ML"]), ("Internet of Things", ["IoT"]),
    ("5G", ["5G networks"]), ("COVID-19", ["COVID-19 pandemic", "COVID"]), ("Moore's Law", []), ("cloud computing", []),
    ("autonomous driving", ["self-driving"]), ("extreme ultraviolet lithography", ["EUV lithography"]),
    ("General Data Protection Regulation", ["GDPR"]), ("Tax Cuts and Jobs Act", []), ("augmented reality", ["AR"]),
    ("virtual reality", ["VR"]), ("high-performance computing", ["HPC"]), ("edge computing", []),
]


def _number_text(unit: str, value: str) -> str:
    """One spelling per value: '10.0' -> '10', '15.80' -> '15.8' ('10%' and '10.0%' are one number)."""
    if unit in {"million", "bps"}:
        return str(int(float(value)))
    text = f"{float(value):.2f}" if unit == "eps" else f"{float(value):.2f}".rstrip("0").rstrip(".")
    return text


_UNIVERSE: Universe | None = None


def get_universe() -> Universe:
    global _UNIVERSE
    if _UNIVERSE is None:
        _UNIVERSE = Universe()
    return _UNIVERSE


# ------------------------------------------------------------------------------------------
# A scaled store: the ten companies copied into many, written as tkg's Parquet store
# ------------------------------------------------------------------------------------------

# Statements (one temporal event each) per call: tkg's LLM path made 1,251 of AMD's four 2017
# calls (the llm_calls accounting of that build; bench_llm's reference run made 1,242).
EVENTS_PER_CALL = 310
DISTINCT_BASES = 4  # event sets generated with their own seed; the copies cycle through them
STORE_CODE_VERSION = "synthetic-scale-1"
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9\-]*")
# Words in the ten companies' own names that name nothing: a copy keeps them.
_KEPT_WORDS = {"inc", "corp", "ltd", "nv", "llc", "plc", "co", "the", "of", "and", "limited", "ag", "se", "sa"}
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st", "kr", "pl", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea")
# The generator's metric names as tkg's figure metrics (tkg.core.tables.FIGURES); others are segment revenue.
_FIGURE_METRICS = {"revenue": "revenue", "gross_margin": "gross_margin", "operating_margin": "operating_margin",
                   "operating_income": "operating_income", "net_income": "net_income", "earnings_per_share": "eps",
                   "free_cash_flow": "free_cash_flow", "operating_expenses": "operating_expenses",
                   "capital_expenditures": "capex"}


def pseudo_word(*parts: object) -> str:
    """A pronounceable made-up word, deterministic in `parts` (three syllables: about 14 million
    words, so the copies of thousands of names rarely collide)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    word = "".join(_ONSETS[digest[1 + 2 * i] % len(_ONSETS)] + _VOWELS[digest[2 + 2 * i] % len(_VOWELS)] for i in range(3))
    return (word + "nrsx"[digest[9] % 4] if digest[8] % 2 else word).capitalize()


class CompanyCopies:
    """Copy k of the ten companies: every word of their own names (company names, tickers, the
    surnames of their officers, their products) is replaced by a made-up word of copy k, the
    same in every spelling ('Intel Corp.', 'Intel Corporation', 'INTC' and 'CFO of Intel Corp.'
    all become copy k's one company), so a resolver has the same work in every copy. Entities
    the companies share (other companies, analysts and their firms, places, concepts, numbers)
    are not copied: every company's calls talk about the same Samsung and the same AI."""

    def __init__(self, universe: Universe) -> None:
        from tkg.resolve.resolution import GENERIC_ORG_WORDS

        kept = _KEPT_WORDS | GENERIC_ORG_WORDS | {w.lower() for p in GENERIC_PRODUCTS for w in _WORD.findall(p)}
        words: set[str] = set()
        for identity in universe.identities.values():
            if identity.company is None or identity.type not in ("Organization", "Person", "Product"):
                continue
            for surface in identity.surfaces:
                tokens = _WORD.findall(person_tokens(surface)[1] if identity.type == "Person" else surface)
                words.update(t for t in tokens if any(c.isupper() for c in t) and t.lower() not in kept)
        self.words = frozenset(words)
        self.tickers = sorted(universe.registry)
        self._tables: dict[int, dict[str, str]] = {}

    def table(self, copy: int) -> dict[str, str]:
        if copy not in self._tables:
            self._tables[copy] = {w: self._word(w, copy) for w in self.words}
        return self._tables[copy]

    @staticmethod
    def _word(word: str, copy: int) -> str:
        made = pseudo_word(copy, word.lower())
        return made.upper()[: max(3, len(word))] if word.isupper() else made

    def rename(self, text: str | None, copy: int) -> str | None:
        if not text or copy == 0:
            return text
        table = self.table(copy)
        return _WORD.sub(lambda m: table.get(m[0], m[0]), text)

    def ticker(self, ticker: str, copy: int) -> str:
        return ticker if copy == 0 else f"{ticker}{copy}"


@dataclass
class StoreSize:
    """What a scaled store holds."""

    events: int
    copies: int
    companies: int
    calls: int
    partitions: int
    rows: Counter
    seconds: float
    bytes_on_disk: int


def scaled_store_plan(n_events: int, universe: Universe | None = None) -> tuple[int, int]:
    """(copies of the ten companies, events per copy) for about `n_events` events at
    EVENTS_PER_CALL events per call."""
    universe = universe or get_universe()
    copies = max(1, round(n_events / (len(universe.calls) * EVENTS_PER_CALL)))
    return copies, round(n_events / copies)


def write_scaled_store(root: Path, n_events: int, workers: int = 2, log=print) -> StoreSize:
    """A tkg Parquet store (`root/parquet`, every partition stamped as whole) of about `n_events`
    events: the ten real companies and their copies on the 188 real call dates, one file per
    (stage, company, quarter), with mentions, triplets, figures, statements, chunks and
    transcripts. Copy k of the companies draws its events from base k % DISTINCT_BASES (event
    sets generated with their own seed). `root/synthetic` keeps the bases and each mention's
    ground-truth entity (for a resolution stand-in; see bench_scale.py)."""
    import time as clock
    from concurrent.futures import ProcessPoolExecutor

    started = clock.perf_counter()
    universe = get_universe()
    copies, per_copy = scaled_store_plan(n_events, universe)
    bases = min(copies, DISTINCT_BASES)
    for base in range(bases):
        tables_of_base = _scaled_base(universe, per_copy, SEED + base)
        folder = root / "synthetic" / f"base{base}"
        folder.mkdir(parents=True, exist_ok=True)
        for stage, table in tables_of_base.items():
            with pa.OSFile(str(folder / f"{stage}.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        log(f"base {base}: {tables_of_base['temporal_events'].num_rows:,} events, {tables_of_base['entities'].num_rows:,} mentions "
            f"({clock.perf_counter() - started:.0f}s)")
    rows: Counter = Counter()
    partitions = 0
    jobs = [(str(root), copy, copy % bases) for copy in range(copies)]
    with ProcessPoolExecutor(max_workers=max(1, min(workers, copies))) as pool:
        for copy, (copy_rows, copy_partitions) in enumerate(pool.map(_write_copy, jobs)):
            rows.update(copy_rows)
            partitions += copy_partitions
            if copy % 10 == 9 or copy == copies - 1:
                log(f"copies written: {copy + 1}/{copies} ({clock.perf_counter() - started:.0f}s)")
    size = sum(p.stat().st_size for p in (root / "parquet").rglob("*.parquet"))
    return StoreSize(rows["temporal_events"], copies, copies * len(universe.registry), copies * len(universe.calls),
                     partitions, rows, round(clock.perf_counter() - started, 1), size)


def _scaled_base(universe: Universe, n: int, seed: int) -> dict[str, pa.Table]:
    """One event set as the store's tables (sorted by company and quarter), plus helper columns
    a copy needs, named with a leading underscore: which names are the companies' own (to be
    renamed) and each mention's ground-truth entity."""
    from tkg.core.embeddings import WordLlamaEmbedder
    from tkg.ingest.sources import load_source

    generated = generate_events(n, universe, seed)
    rng = random.Random(seed * 31 + n)
    events = generated.events
    created = dict(zip(events.column("event_id").to_pylist(), events.column("created_at").to_pylist()))
    transcript_of = dict(zip(events.column("event_id").to_pylist(), events.column("transcript_id").to_pylist()))
    mentions: dict[tuple[str, str], dict] = {}
    triplets, figures = [], []
    for row in generated.triplets.to_pylist():
        ends = []
        for side in ("subject", "object"):
            cluster_id = row[f"{side}_id"]
            if cluster_id is None:
                ends.append(None)
                continue
            mention = mentions.get((row["event_id"], cluster_id))
            if mention is None:
                identity = universe.identities.get(cluster_id)
                if identity is not None and identity.surfaces:
                    name, _ = universe.pick_surface(identity, rng)
                    kind, description = identity.type, rng.choice(identity.descriptions) if identity.descriptions else ""
                    owned = identity.company is not None
                else:  # a number made for this event only
                    name, kind, description, owned = row[side], "Numeric", "A reported figure", False
                mention = mentions[(row["event_id"], cluster_id)] = {
                    "entity_id": hashlib.sha256(f"{row['event_id']}|{cluster_id}".encode()).hexdigest()[:20],
                    "event_id": row["event_id"], "company": row["company"], "quarter": row["quarter"], "name": name,
                    "type": kind, "description": description, "seen_at": created[row["event_id"]], "_owned": owned,
                    "_truth": cluster_id}
            ends.append(mention)
        subject, obj = ends
        triplets.append({
            "triplet_id": row["triplet_id"], "event_id": row["event_id"], "company": row["company"], "quarter": row["quarter"],
            "subject_name": subject["name"], "subject_entity_id": subject["entity_id"], "predicate": row["predicate"],
            "object_name": obj["name"] if obj else row["object"], "object_entity_id": obj["entity_id"] if obj else None,
            "value": row["value"], "subject_type": subject["type"], "subject_description": subject["description"],
            "object_type": obj["type"] if obj else None, "object_description": obj["description"] if obj else None,
            "seen_at": created[row["event_id"]], "_subject_owned": subject["_owned"], "_object_owned": bool(obj and obj["_owned"])})
        figure = _figure(row, created[row["event_id"]], transcript_of[row["event_id"]])
        if figure:
            figures.append(figure)
    mention_rows = list(mentions.values())
    texts = sorted({f"{m['name']}: {m['description']}" for m in mention_rows})
    vectors = WordLlamaEmbedder().embed(texts)
    position = {text: i for i, text in enumerate(texts)}
    mention_vectors = vectors[[position[f"{m['name']}: {m['description']}"] for m in mention_rows]]
    owned_schema = [("_owned", pa.bool_()), ("_truth", pa.string())]
    entities = pa.Table.from_pylist(mention_rows, schema=_with(tables.ENTITIES, owned_schema, without="embedding"))
    entities = entities.append_column("embedding", _embedding_column(mention_vectors))
    entities = entities.select([*tables.ENTITIES.names, "_owned", "_truth"])

    texts_of_calls = {(r.company, r.call_date): r.text for r in load_source(str(CORPUS)).rows}
    calls = {f"{c.company}_{c.call_date:%Y%m%d}": c for c in universe.calls}
    chunk_rows, transcript_rows = [], []
    chunks_of_call: dict[str, list[str]] = defaultdict(list)
    for transcript_id, chunk_id in sorted(set(zip(events.column("transcript_id").to_pylist(), events.column("chunk_id").to_pylist()))):
        chunks_of_call[transcript_id].append(chunk_id)
    for transcript_id, call in calls.items():
        text = texts_of_calls.get((call.company, call.call_date), "")
        quarter = date(call.call_date.year, 3 * ((call.call_date.month - 1) // 3) + 1, 1)
        company_name = universe.registry[call.company].name
        transcript_rows.append({
            "transcript_id": transcript_id, "company": call.company, "quarter": quarter, "company_name": company_name,
            "call_date": call.call_date, "call_datetime": call.call_datetime,
            "title": f"{company_name} {call.fiscal_quarter} Earnings Call",
            "doc_type": "synthetic copy of a StreetEvents transcript", "fiscal_quarter": call.fiscal_quarter,
            "fiscal_year": call.fiscal_year, "fiscal_period_start": call.period_start, "fiscal_period_end": call.period_end,
            "participants": [], "participants_start": 0, "participants_end": 0, "turns": [], "body_end": len(text),
            "content_sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text})
        ids = chunks_of_call.get(transcript_id, [])
        width = max(1, len(text) // max(1, len(ids)))
        for index, chunk_id in enumerate(ids):
            chunk_rows.append({
                "chunk_id": chunk_id, "transcript_id": transcript_id, "company": call.company, "quarter": quarter,
                "chunk_index": index, "kind": "speech", "section": "Presentation", "speaker": None,
                "speaker_organization": None, "speaker_title": None, "start_offset": index * width,
                "end_offset": min(len(text), (index + 1) * width), "text": text[index * width:(index + 1) * width]})
    statements = events.select(["event_id", "chunk_id", "transcript_id", "company", "quarter", "statement", "statement_hash",
                                "statement_type", "temporal_type"]).rename_columns(
        ["statement_id", "chunk_id", "transcript_id", "company", "quarter", "statement", "statement_hash", "statement_type",
         "temporal_type"])
    statements = statements.add_column(5, "statement_index", pa.array(np.zeros(statements.num_rows, dtype=np.int32)))
    built = {
        "transcripts": pa.Table.from_pylist(transcript_rows, schema=tables.TRANSCRIPTS),
        "chunks": pa.Table.from_pylist(chunk_rows, schema=tables.CHUNKS),
        "statements": statements.select(tables.STATEMENTS.names).cast(tables.STATEMENTS),
        "temporal_events": events,
        "triplets": pa.Table.from_pylist(triplets, schema=_with(tables.TRIPLETS, [("_subject_owned", pa.bool_()),
                                                                                 ("_object_owned", pa.bool_())])),
        "figures": tables.to_table(figures, tables.FIGURES),
        "entities": entities,
    }
    return {stage: table.take(pc.sort_indices(table, sort_keys=[("company", "ascending"), ("quarter", "ascending")]))
            for stage, table in built.items()}


def _with(schema: pa.Schema, extra: list[tuple[str, pa.DataType]], without: str | None = None) -> pa.Schema:
    return pa.schema([f for f in schema if f.name != without] + [pa.field(n, t) for n, t in extra])


def _embedding_column(vectors: np.ndarray) -> pa.Array:
    flat = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])
    return flat.cast(tables.EMBEDDING)


def _figure(triplet: dict, stated_at: datetime, transcript_id: str) -> dict | None:
    """The figure a revenue or guidance triplet states (the metric and period come from the
    target's id, 'met:INTC:revenue_guidance:FY2017'), as tkg's figures stage would record it."""
    value, target = triplet["value"], triplet["object_id"] or ""
    if triplet["predicate"] not in ("HAS_REVENUE", "TARGETS") or not value or not target.startswith("met:"):
        return None
    _, _, metric, label = target.split(":")
    guidance = metric.endswith("_guidance")
    metric = metric.removesuffix("_guidance")
    amount = float(re.sub(r"[^\d.]", "", value))
    unit = "percent" if value.endswith("%") else "USD"
    year, quarter = (int(label[2:]), None) if label.startswith("FY") else (int(label[2:]), int(label[1]))
    return {
        "figure_id": hashlib.sha256(f"{triplet['triplet_id']}|figure".encode()).hexdigest()[:20],
        "event_id": triplet["event_id"], "transcript_id": transcript_id, "company": triplet["company"], "quarter": triplet["quarter"],
        "call_date": stated_at.date(), "stated_at": stated_at, "metric": _FIGURE_METRICS.get(metric, "segment_revenue"),
        "segment": None if metric in _FIGURE_METRICS else metric, "basis": None, "kind": "guidance" if guidance else "reported",
        "fiscal_year": year, "fiscal_quarter": quarter, "value": amount * (1e9 if unit == "USD" else 1.0), "low": None,
        "high": None, "unit": unit, "amount_text": value}


@lru_cache(maxsize=DISTINCT_BASES)
def _base_tables(root: str, base: int) -> dict[str, pa.Table]:
    folder = Path(root) / "synthetic" / f"base{base}"
    return {path.stem: pa.ipc.open_file(pa.memory_map(str(path))).read_all() for path in sorted(folder.glob("*.arrow"))}


@lru_cache(maxsize=1)
def _copies() -> CompanyCopies:
    return CompanyCopies(get_universe())


def _write_copy(job: tuple[str, int, int]) -> tuple[Counter, int]:
    """Worker: copy `copy` of the companies from base `base`, written partition by partition."""
    from tkg.build.catalog import PARTITIONED_NAMES
    from tkg.core.versions import stamped
    from tkg.store.parquet import ParquetStore

    root, copy, base = job
    store = ParquetStore(root)
    stamps = store_stamps()
    rows: Counter = Counter()
    partitions: set[tuple[str, date]] = set()
    for stage in PARTITIONED_NAMES:
        table = _copied(_base_tables(root, base)[stage], stage, copy)
        if stage == "entities":
            truth_folder = Path(root) / "synthetic" / "truth"
            truth_folder.mkdir(parents=True, exist_ok=True)
            truth = table.select(["entity_id", "_truth", "name", "type", "seen_at"]).rename_columns(
                ["entity_id", "canonical_id", "name", "type", "seen_at"])
            pq.write_table(truth, truth_folder / f"copy{copy:04d}.parquet")
        table = table.select(getattr(tables, _SCHEMA_OF[stage]).names)
        rows[stage] += table.num_rows
        companies, quarters = table.column("company").to_pylist(), table.column("quarter").to_pylist()
        start = 0
        for end in range(1, len(companies) + 1):
            if end == len(companies) or (companies[end], quarters[end]) != (companies[start], quarters[start]):
                store.write(store.partition_path(stage, companies[start], quarters[start]),
                            stamped(table.slice(start, end - start), stamps[stage]))
                partitions.add((companies[start], quarters[start]))
                start = end
    return rows, len(partitions)


_ID_COLUMNS = {"event_id", "chunk_id", "transcript_id", "triplet_id", "entity_id", "subject_entity_id", "object_entity_id",
               "figure_id", "statement_id"}
_SCHEMA_OF = {"transcripts": "TRANSCRIPTS", "chunks": "CHUNKS", "statements": "STATEMENTS", "temporal_events": "EVENTS",
              "triplets": "TRIPLETS", "figures": "FIGURES", "entities": "ENTITIES"}


def store_stamps() -> dict:
    """One stamp per partitioned stage, each built from the version of its inputs, as a whole
    partition's files carry them (tkg.build.state.half_built checks exactly that)."""
    from tkg.build import catalog
    from tkg.core.versions import Stamp

    stamps: dict = {}
    for stage in catalog.PARTITIONED_NAMES:  # upstream stages come first
        inputs = {upstream: stamps[upstream].version for upstream in catalog.stage(stage).inputs} or {"source": "synthetic"}
        stamps[stage] = Stamp(stage, STORE_CODE_VERSION, inputs)
    return stamps


def _copied(table: pa.Table, stage: str, copy: int) -> pa.Table:
    """`table` of base rows as copy `copy` of the companies: ids prefixed, tickers and the
    companies' own names renamed, statement hashes recomputed."""
    if copy == 0:
        return table
    copies = _copies()
    prefix = f"k{copy:04d}"
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if name in _ID_COLUMNS:
            column = pc.binary_join_element_wise(prefix, column, "")
        elif name == "company":
            column = _mapped(column, lambda t: copies.ticker(t, copy))
        columns[name] = column
    def renamed(name: str, mask: str | None = None) -> None:
        if name not in columns:
            return
        new = _mapped(columns[name], lambda text: copies.rename(text, copy))
        columns[name] = pc.if_else(columns[mask], new, columns[name]) if mask else new
    if stage in ("temporal_events", "statements"):
        renamed("statement")
        columns["statement_hash"] = pa.chunked_array([[hashlib.sha256(s.encode()).hexdigest()[:16]
                                                       for s in columns["statement"].to_pylist()]])
    elif stage == "triplets":
        for side in ("subject", "object"):
            renamed(f"{side}_name", f"_{side}_owned")
            renamed(f"{side}_description", f"_{side}_owned")
    elif stage == "entities":
        renamed("name", "_owned")
        renamed("description", "_owned")
        columns["_truth"] = pc.if_else(columns["_owned"], pc.binary_join_element_wise(columns["_truth"], f"~{copy}", ""),
                                       columns["_truth"])
    elif stage == "transcripts":
        renamed("company_name")
        renamed("title")
    return pa.table(columns, schema=table.schema)


def _mapped(column, function) -> pa.ChunkedArray:
    """`function` applied to each distinct value of a string column (nulls stay null)."""
    encoded = column.combine_chunks().dictionary_encode() if isinstance(column, pa.ChunkedArray) else column.dictionary_encode()
    values = pa.array([function(v) for v in encoded.dictionary.to_pylist()], type=pa.string())
    return pa.chunked_array([values.take(encoded.indices)])
