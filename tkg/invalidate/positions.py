"""Positions end by evidence: what the participants lists say about who holds which job.

Every call lists its company's officers and the analysts on the line, each with a firm and a
title. Read in time order, those lists end positions that no single statement retires:

- **one firm at a time**: a person listed at another firm ends every position at the earlier
  firm, at the call that first shows the new one ('Amit Daryanani, RBC' -> 'Amit Daryanani,
  Evercore ISI'); a firm's spellings are one firm (`firm_clusters`);
- **a later title replaces the earlier one** at the same firm: a person listed at the firm
  without a title they held, and never listed with it again, ends that title ('Senior Analyst'
  -> 'MD'). Lists spell titles inconsistently, so a title left out once is not given up;
- **single-holder offices** (the policy's `single_holder_offices`: investor-relations head,
  president, COO, CTO, each named segment head): a different person listed in the office at
  a later call of the company ends the earlier holder, unless both are listed at once; a
  holder listed in it again later starts a new tenure;
- **absence**, only for the offices the policy says are on every call (`absence_ends`): a
  holder never listed again ends at the first call without them. That ending is inferred, not
  stated, and is labelled 'absence' with the reason 'absent from the participants from <call>
  on' instead of a retiring statement.

CEO and CFO (and the other `offices`) stay with the judge, which compares office entities
pairwise; the earliest ending from either wins (tkg.invalidate.invalidation.retirements).
Like the rest of invalidation the result is a function of the set of listings: each is
compared with every later call, whatever order partitions were built in.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from tkg.core import policy as policy_module
from tkg.core.names import firm_key, fold, same_firm

STATEMENT, ABSENCE = "statement", "absence"
_SEGMENT_WORDS = re.compile(r"\b(?:the|group|business|division|unit|segment|organization|organisation)\b")


@dataclass(frozen=True)
class Listing:
    """One office of one person in one call's participants list (a HOLDS_ROLE event)."""

    event_id: str
    call: str  # the transcript
    company: str  # the ticker of the call's company
    at: datetime  # when the call took place (the listing's valid_at)
    known_at: datetime  # when the call was published (created_at)
    person_id: str
    person: str
    office_id: str
    title: str  # the office without the company: 'Corporate VP of IR', 'MD'
    firm: str | None  # the organisation as listed
    corporate: bool  # one of the company's own people, not an analyst

    def firm_words(self) -> frozenset[str]:
        # A company's own people are at the company, however the list spells it.
        return frozenset({f"company:{self.company}"}) if self.corporate else firm_key(self.firm)


@dataclass(frozen=True)
class PositionEnd:
    invalid_at: datetime
    invalidated_by: str | None  # the listing that shows the change; None when the evidence is absence
    evidence: str  # STATEMENT or ABSENCE
    reason: str
    known_at: datetime  # when the ending became known: the publication of the call that shows it

    def order(self) -> tuple:
        return (self.invalid_at, self.evidence != STATEMENT, self.invalidated_by or "")


def office_class(title: str, rules: policy_module.InvalidationPolicy | None = None) -> tuple[str, str] | None:
    """The single-holder office a title is in, as (office name, key): ('investor relations
    head', ''), ('segment head', 'data center'), or None for an office many people hold."""
    rules = rules or policy_module.POLICY
    for name, pattern, _ in rules.single_holder_offices:
        if match := re.search(pattern, title, re.IGNORECASE):
            segment = match.groupdict().get("segment")
            return name, " ".join(_SEGMENT_WORDS.sub(" ", fold(segment)).split()) if segment else ""
    return None


_TITLE_NOISE = re.compile(r"\b(?:of|the|and|for)\b|&")
_TITLE_SPELLINGS = ((re.compile(r"\bsr\b"), "senior"), (re.compile(r"\bdir\b"), "director"),
                    (re.compile(r"\bgm\b"), "general manager"), (re.compile(r"\bmd\b"), "managing director"),
                    (re.compile(r"\binvestor relations\b"), "ir"))


def title_key(title: str) -> str:
    """A title without its spelling: 'General Manager IR', 'General Manager of IR' and 'GM of
    Investor Relations' are one title, so a list that spells it differently changes nothing.
    A title is still held while its words are all among the person's titles at the firm."""
    text = fold(title)
    for pattern, replacement in _TITLE_SPELLINGS:
        text = pattern.sub(replacement, text)
    return " ".join(_TITLE_NOISE.sub(" ", text).split())


def _day(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d}"


def call_label(listing: Listing) -> str:
    return f"the {listing.company} call of {_day(listing.at)}"


def end_positions(listings: list[Listing], rules: policy_module.InvalidationPolicy | None = None) -> dict[str, PositionEnd]:
    """Each listing's earliest ending by the rules of the module docstring (event id -> end)."""
    rules = rules or policy_module.POLICY
    ends: dict[str, PositionEnd] = {}

    def propose(listing: Listing, end: PositionEnd) -> None:
        if listing.event_id not in ends or end.order() < ends[listing.event_id].order():
            ends[listing.event_id] = end

    _firms_and_titles(listings, rules, propose)
    _single_holders(listings, rules, propose)
    return ends


def _calls(rows: list[Listing]) -> list[tuple[datetime, str, list[Listing]]]:
    """Listings grouped by call, in time order."""
    grouped: dict[tuple[datetime, str], list[Listing]] = defaultdict(list)
    for row in rows:
        grouped[(row.at, row.call)].append(row)
    return [(at, call, sorted(found, key=lambda r: r.event_id)) for (at, call), found in sorted(grouped.items())]


def _last(calls, holds) -> int | None:
    """The index of the last call at which `holds(listings of that call)` is true."""
    return max((index for index, (_, _, here) in enumerate(calls) if holds(here)), default=None)


def firm_clusters(rows: list[Listing]) -> dict[str, tuple[int, frozenset[str]]]:
    """One person's firms: each listing's firm number and the key of the firm's first spelling.
    Spellings chain ('SIG' ~ 'Susquehanna International Group' ~ 'Susquehanna Financial
    Group'), visited in time order so the numbering is a function of the listings."""
    clusters: list[list[frozenset[str]]] = []
    found = {}
    for row in sorted(rows, key=lambda r: (r.at, r.event_id)):
        words = row.firm_words()
        number = next((n for n, members in enumerate(clusters) if any(same_firm(words, m) for m in members)), None)
        if number is None:
            clusters.append([words])
            number = len(clusters) - 1
        elif words not in clusters[number]:
            clusters[number].append(words)
        found[row.event_id] = (number, clusters[number][0])
    return found


def _firms_and_titles(listings: list[Listing], rules, propose) -> None:
    """A job at a firm ends at the first later call that lists the person at another firm only;
    a title ends at the first call after its last listing that lists the person at the firm
    under other titles only. The title is measured from its last listing because lists spell
    titles inconsistently ('President, CEO' between two 'President, CEO & Director'): a title
    listed again later was never given up."""
    by_person: dict[str, list[Listing]] = defaultdict(list)
    for row in listings:
        by_person[row.person_id].append(row)
    for rows in by_person.values():
        calls = _calls(rows)
        index_of = {(at, call): index for index, (at, call, _) in enumerate(calls)}
        firms = firm_clusters(rows)
        for row in rows:
            firm, words = firms[row.event_id][0], set(title_key(row.title).split())

            def at_firm(here: list[Listing]) -> list[Listing]:
                return [r for r in here if firms[r.event_id][0] == firm]

            def holds(here: list[Listing]) -> bool:
                # the same office entity, or its words all within the titles listed at the firm
                # ('Corporate Vice President, IR' is two offices, 'Corporate VP of IR' one)
                listed = at_firm(here)
                return any(r.office_id == row.office_id for r in listed) or (
                    bool(listed) and words <= {word for r in listed for word in title_key(r.title).split()})

            if rules.one_firm_at_a_time:
                for later_at, _, later in calls[index_of[(row.at, row.call)] + 1:]:
                    if later_at > row.at and not at_firm(later):
                        shown = later[0]
                        where = shown.firm if not shown.corporate else shown.company
                        propose(row, PositionEnd(later_at, shown.event_id, STATEMENT,
                                                 f"{row.person} listed at {where} from {call_label(shown)}: "
                                                 "a person works at one firm at a time", shown.known_at))
                        break
            if rules.titles_replace_titles:
                for later_at, _, later in calls[_last(calls, holds) + 1:]:
                    here = at_firm(later)
                    if later_at > row.at and here:
                        titles = ", ".join(sorted({r.title for r in here}))
                        propose(row, PositionEnd(later_at, here[0].event_id, STATEMENT,
                                                 f"{row.person} listed as {titles} from {call_label(here[0])}: "
                                                 f"the later title replaces {row.title}", here[0].known_at))
                        break


def _single_holders(listings: list[Listing], rules, propose) -> None:
    """A single-holder office ends at the first later call that lists someone else in it and not
    its holder; for `absence_ends` offices, also at the first call after the holder's last
    listing in it that does not list them at all."""
    by_company: dict[str, list[Listing]] = defaultdict(list)
    for row in listings:
        if row.corporate:
            by_company[row.company].append(row)
    reasons = {name: reason for name, _, reason in rules.single_holder_offices}
    absent_offices = {name for name, _ in rules.absence_ends}
    for rows in by_company.values():
        calls = _calls(rows)
        holders: list[dict[tuple[str, str], list[Listing]]] = []
        for _, _, here in calls:
            offices: dict[tuple[str, str], list[Listing]] = defaultdict(list)
            for row in here:
                if found := office_class(row.title, rules):
                    offices[found].append(row)
            holders.append(offices)
        listed = [{row.person_id for row in here} for _, _, here in calls]

        def last_listed(row: Listing, office: tuple[str, str]) -> int:
            # absence is an ending only once the holder is never listed in the office again
            return max(i for i, found in enumerate(holders) if any(r.person_id == row.person_id for r in found.get(office, ())))
        for index, offices in enumerate(holders):
            for office, held in offices.items():
                for row in held:
                    # the run of calls listing them in the office ends at the first that lists
                    # someone else in it: a later return is a new tenure
                    for later in range(index + 1, len(calls)):
                        others = holders[later].get(office, [])
                        if calls[later][0] <= row.at or any(other.person_id == row.person_id for other in others):
                            continue
                        if others:
                            successor = others[0]
                            where = f"{office[0]} ({office[1]})" if office[1] else office[0]
                            propose(row, PositionEnd(successor.at, successor.event_id, STATEMENT,
                                                     f"{successor.person} listed as {successor.title} from "
                                                     f"{call_label(successor)}: the {where} is held by one person at "
                                                     f"a time ({reasons[office[0]]})", successor.known_at))
                            break
                        if (office[0] in absent_offices and row.person_id not in listed[later]
                                and later > last_listed(row, office)):
                            first = calls[later][2][0]
                            propose(row, PositionEnd(first.at, None, ABSENCE,
                                                     f"absent from the participants from {call_label(first)} on",
                                                     first.known_at))
                            break


# The HOLDS_ROLE events of the participants lists, with the canonical person and office
# (views `events`, `triplets` (sql/triplets.sql) and `participant_chunks` (chunk_id)).
LISTINGS_SQL = """
    SELECT t.event_id, e.transcript_id AS call, e.company, e.valid_at AS at, e.created_at AS known_at,
           t.subject_id AS person_id, t.subject AS person, t.subject_mention,
           coalesce(t.object_id, t.object_mention) AS office_id, t.object_mention, t.value, e.chunk_id
    FROM triplets AS t
    JOIN events AS e USING (event_id)
    JOIN participant_chunks AS c ON c.chunk_id = e.chunk_id
    WHERE t.predicate = 'HOLDS_ROLE' AND e.statement_type = 'FACT' AND e.valid_at IS NOT NULL
      AND t.subject_id IS NOT NULL
    ORDER BY t.event_id"""


def listings_from_rows(rows: list[dict], chunk_texts: dict[str, str]) -> tuple[list[Listing], int]:
    """Listings from LISTINGS_SQL rows, each matched to its entry in the participants list (by
    name) for its firm and kind; rows naming nobody in the list are counted and left out."""
    from tkg.core.companies import get_company
    from tkg.ingest.parsing import parse_participant_sections

    by_chunk: dict[str, dict[str, object]] = {}
    listings, unmatched = [], 0
    for row in rows:
        if row["chunk_id"] not in by_chunk:
            by_chunk[row["chunk_id"]] = {fold(p.name): p for p in parse_participant_sections(chunk_texts[row["chunk_id"]])}
        participant = by_chunk[row["chunk_id"]].get(fold(row["subject_mention"] or ""))
        if participant is None:
            unmatched += 1
            continue
        company_name = get_company(row["company"]).name
        office = row["object_mention"] or ""
        title = office
        # the office names its organisation with or without the final period ('Amazon.com, Inc.')
        suffixes = [f" of {name.rstrip('.')}{end}" for name in (participant.organization, company_name) if name
                    for end in (".", "")]
        for suffix in suffixes:
            if office.endswith(suffix):
                title = office[: -len(suffix)]
                break
        else:
            if participant.kind != "corporate" and row["value"]:
                title = row["value"]
        title = re.sub(r"^(?:interim|acting)\s+", "", title, flags=re.IGNORECASE)
        listings.append(Listing(
            event_id=row["event_id"], call=row["call"], company=row["company"], at=row["at"], known_at=row["known_at"],
            person_id=row["person_id"], person=row["person"], office_id=row["office_id"], title=title,
            firm=participant.organization, corporate=participant.kind == "corporate"))
    return listings, unmatched


def listing_table(listings: list[Listing]):
    """The listings as rows of tables.POSITION_LISTINGS, each firm keyed once per person: the
    key of the first listed spelling of the same firm (`firm_clusters`)."""
    from tkg.core import tables

    by_person: dict[str, list[Listing]] = defaultdict(list)
    for listing in listings:
        by_person[listing.person_id].append(listing)
    firms = {event_id: found for rows in by_person.values() for event_id, found in firm_clusters(rows).items()}
    rows = []
    for listing in listings:
        key = firms[listing.event_id][1]
        office = office_class(listing.title) if listing.corporate else None
        rows.append({"event_id": listing.event_id, "company": listing.company, "call_at": listing.at,
                     "person_id": listing.person_id, "person": listing.person, "title": listing.title,
                     "firm": listing.firm, "firm_key": " ".join(sorted(word for word in key if not word.startswith("^"))), "corporate": listing.corporate,
                     "single_holder_office": (f"{office[0]}: {office[1]}" if office[1] else office[0]) if office else None})
    rows.sort(key=lambda r: r["event_id"])
    return tables.to_table(rows, tables.POSITION_LISTINGS)
