"""Parser for Thomson Reuters / Refinitiv StreetEvents transcripts (the earnings-call corpus).

The format: a header (vendor line, title with the fiscal quarter, call date and time in GMT),
sections between 80-character `=` rulers (`Corporate Participants`, `Conference Call
Participiants` [sic], `Presentation`, `Questions and Answers`; "Event Brief" files have
`OVERVIEW`, `FINANCIAL DATA`, `PRESENTATION SUMMARY`, `QUESTIONS AND ANSWERS`), speaker
turns and sub-headings between 80-character `-` rulers, and trailing `Definitions` and
`Disclaimer` boilerplate, which is dropped. Every turn keeps its character offsets into the
original text.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone

from tkg.core.companies import Company
from tkg.core.models import Participant, Transcript, Turn

SECTION_HEADER = re.compile(r"^={20,}\S*[ \t]*\n(?P<name>[^\n=]+?)[ \t]*\n={20,}\S*[ \t]*$", re.MULTILINE)
BLOCK_HEADER = re.compile(r"^-{20,}[ \t]*\n(?P<header>[^\n]+?)[ \t]*\n-{20,}[ \t]*\n", re.MULTILINE)
TURN_HEADER = re.compile(r"^(?P<speaker>.+?)\s{2,}\[(?P<number>\d+)\]$")
TITLE_LINE = re.compile(r"^(?P<title>.*\bQ(?P<quarter>[1-4])\s+(?P<year>\d{4})\b.*)$", re.MULTILINE)
DATE_LINE = re.compile(
    r"^(?P<date>[A-Z]+ \d{1,2}, \d{4})(?:\s*/\s*(?P<time>\d{1,2}:\d{2}\s*[AP]M)\s*(?:GMT)?)?\s*$", re.MULTILINE
)
PARTICIPANT = re.compile(r"^[ \t]*\*[ \t]+(?P<name>[^\n]+?)[ \t]*\n(?P<affiliation>[ \t]+[^\n*]*)$", re.MULTILINE)
BOILERPLATE_SECTIONS = {"definitions", "disclaimer"}
PARTICIPANT_SECTIONS = {
    "corporate participants": "corporate",
    "conference call participiants": "conference",
    "conference call participants": "conference",
}
# Words that mark an affiliation fragment as a job title rather than an organisation.
TITLE_WORDS = re.compile(
    r"\b(CEO|CFO|COO|CTO|VP|SVP|EVP|President|Director|Chairman|Officer|Head|Manager|Analyst|Treasurer|"
    r"Secretary|Counsel|Investor Relations|IR)\b",
    re.IGNORECASE,
)


class TranscriptParseError(ValueError):
    """A transcript does not have the StreetEvents layout; the message says what is missing."""


@dataclass(frozen=True)
class SourceRow:
    company: str
    call_date: date
    text: str
    origin: str = field(default="", compare=False)  # where the row came from, for messages: 'calls.jsonl line 7'


def split_affiliation(affiliation: str) -> tuple[str | None, str | None]:
    """Split 'Organisation - Title' into its parts.

    The organisation is everything before the first ' - '; the title keeps any further
    ' - Organisation' suffix ('CEO - Google Inc.'), which the role parser reads. Fragments
    with only one side ('Sr. Director Investor Relations -', ' - ') are placed by their words.
    """
    text = " ".join(affiliation.split())
    if text in {"", "-"}:
        return None, None
    organization, separator, title = text.partition(" - ")
    if not separator:
        organization, title = (text.rstrip(" -"), "") if text.endswith("-") else (text, "")
        if text.startswith("- "):
            organization, title = "", text[2:]
    organization, title = organization.strip() or None, title.strip() or None
    if title is None and organization and TITLE_WORDS.search(organization):
        organization, title = None, organization
    return organization, title


def parse_participants(block: str, kind: str) -> list[Participant]:
    participants = []
    for match in PARTICIPANT.finditer(block):
        name, title_in_name = match["name"], None
        if ";" in name:  # 'Jim Friedland;Director of Investor Relations'
            name, title_in_name = (part.strip() for part in name.split(";", 1))
        organization, title = split_affiliation(match["affiliation"])
        participants.append(Participant(name=name.strip(), organization=organization, title=title or title_in_name, kind=kind))
    return participants


def _split_speaker(header: str) -> tuple[str, str | None, str | None]:
    """'Lisa Su,  Advanced Micro Devices, Inc. - President and CEO' -> name, organisation, title."""
    name, separator, affiliation = header.partition(",  ")
    if not separator:
        return header.strip(), None, None
    organization, title = split_affiliation(affiliation)
    return name.strip(), organization, title


def _call_datetime(header: str, fallback: date) -> datetime:
    match = DATE_LINE.search(header)
    if not match:
        return datetime(fallback.year, fallback.month, fallback.day, tzinfo=timezone.utc)
    day = datetime.strptime(match["date"].title(), "%B %d, %Y")
    if match["time"]:
        clock = datetime.strptime(match["time"].replace(" ", ""), "%I:%M%p")
        day = day.replace(hour=clock.hour, minute=clock.minute)
    return day.replace(tzinfo=timezone.utc)


def _initials_of(name: str) -> str:
    return "".join(part[0] for part in re.findall(r"[A-Za-z][A-Za-z'\-]*", name) if part[0].isupper())


def parse_transcript(row: SourceRow, company: Company) -> Transcript:
    """Parse one StreetEvents transcript into a `Transcript` with participants and turns.

    Raises TranscriptParseError when the text has no title with a fiscal quarter or no
    sections, naming the transcript so the caller can count it as skipped.
    """
    text = row.text
    label = f"transcript {row.company} {row.call_date.isoformat()}" + (f" ({row.origin})" if row.origin else "")
    if not text or not text.strip():
        raise TranscriptParseError(f"{label} is empty; check the `transcript` column of the source row")

    sections = list(SECTION_HEADER.finditer(text))
    if not sections:
        raise TranscriptParseError(f"{label} has no '=====' section rulers; it is not in StreetEvents format")
    header = text[: sections[0].start()]
    header_lines = [line.strip() for line in header.splitlines() if line.strip()]
    doc_type = next((line for line in header_lines if "StreetEvents" in line), header_lines[0] if header_lines else "")
    title_match = TITLE_LINE.search(header)
    if title_match is None:
        raise TranscriptParseError(f"{label} has no title line with a fiscal quarter like 'Q2 2016 ... Earnings Call'")
    title = title_match["title"].strip()
    fiscal_q, fiscal_year = int(title_match["quarter"]), int(title_match["year"])
    company_name = re.sub(r"^\s*Q[1-4]\s+\d{4}\s+|\s+Earnings Call.*$", "", title).strip() or company.name
    call_datetime = _call_datetime(header, row.call_date)
    if call_datetime.date() != row.call_date:
        # The source row's date is authoritative (it names the file); keep the header's clock time.
        call_datetime = call_datetime.replace(year=row.call_date.year, month=row.call_date.month, day=row.call_date.day)

    # Boilerplate starts at the first Definitions/Disclaimer block; nothing after it is kept.
    body_end = len(text)
    for block in BLOCK_HEADER.finditer(text):
        if block["header"].strip().lower() in BOILERPLATE_SECTIONS:
            body_end = block.start()
            break

    participants: list[Participant] = []
    participants_span: list[int] = []
    turns: list[Turn] = []
    for position, section in enumerate(sections):
        if section.start() >= body_end:
            break
        name = " ".join(section["name"].split())
        content_start = section.end()
        content_end = sections[position + 1].start() if position + 1 < len(sections) else body_end
        content_end = min(content_end, body_end)
        kind = PARTICIPANT_SECTIONS.get(name.lower())
        if kind:
            participants.extend(parse_participants(text[content_start:content_end], kind))
            participants_span += [section.start(), content_end]
            continue
        turns.extend(_parse_turns(text, content_start, content_end, name, len(turns)))

    _attribute_summary_headings(turns, participants)
    start, end = company.fiscal_period(fiscal_q, fiscal_year)
    return Transcript(
        transcript_id=f"{row.company}_{row.call_date:%Y%m%d}",
        company=row.company,
        company_name=company_name,
        call_date=row.call_date,
        call_datetime=call_datetime,
        title=title,
        doc_type=doc_type,
        fiscal_quarter=f"Q{fiscal_q} {fiscal_year}",
        fiscal_year=fiscal_year,
        fiscal_period_start=start,
        fiscal_period_end=end,
        participants=participants,
        participants_start=min(participants_span, default=0),
        participants_end=max(participants_span, default=0),
        turns=turns,
        text=text,
        body_end=body_end,
        content_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
    )


def _parse_turns(text: str, start: int, end: int, section: str, first_index: int) -> list[Turn]:
    """Split one section into speaker turns (or summary blocks under sub-headings)."""
    headers = [match for match in BLOCK_HEADER.finditer(text, start, end)]
    blocks: list[tuple[str | None, int, int]] = []
    if not headers or text[start : headers[0].start()].strip():
        # Text before the first ruler (OVERVIEW, FINANCIAL DATA) is an unattributed summary block.
        blocks.append((None, start, headers[0].start() if headers else end))
    for position, header in enumerate(headers):
        block_end = headers[position + 1].start() if position + 1 < len(headers) else end
        blocks.append((header["header"], header.end(), block_end))

    turns = []
    for header, block_start, block_end in blocks:
        body = text[block_start:block_end]
        stripped = body.strip()
        if not stripped:
            continue
        lead = len(body) - len(body.lstrip())
        turn_start, turn_end = block_start + lead, block_start + lead + len(stripped)
        speaker, organization, title, heading = "", None, None, None
        if header is not None:
            turn_match = TURN_HEADER.match(header.strip())
            if turn_match:
                speaker, organization, title = _split_speaker(turn_match["speaker"])
            else:
                heading = header.strip()  # an Event Brief sub-heading, e.g. 'I. 1Q16 Business Review (T.C.)'
        turns.append(
            Turn(index=first_index + len(turns), section=section, speaker=speaker, organization=organization,
                 title=title, heading=heading, start=turn_start, end=turn_end, text=stripped)
        )
    return turns


def _attribute_summary_headings(turns: list[Turn], participants: list[Participant]) -> None:
    """Give Event Brief summary blocks the speaker whose initials end their heading, e.g. (T.C.)."""
    by_initials: dict[str, Participant] = {}
    for participant in participants:
        if participant.kind == "corporate":
            full = _initials_of(participant.name)
            by_initials.setdefault(full[0] + full[-1] if len(full) > 1 else full, participant)
    for turn in turns:
        if turn.speaker or not turn.heading:
            continue
        match = re.search(r"\(([A-Z](?:\.\s?[A-Z])+)\.?\)\s*$", turn.heading)
        if not match:
            continue
        initials = match[1].replace(".", "").replace(" ", "")
        participant = by_initials.get(initials[0] + initials[-1])
        if participant:
            turn.speaker, turn.organization, turn.title = participant.name, participant.organization, participant.title


def parse_participant_sections(text: str) -> list[Participant]:
    """Participants from a text holding the 'Corporate Participants' / 'Conference Call
    Participiants' sections (the participants chunk), each tagged corporate or conference."""
    sections = list(SECTION_HEADER.finditer(text))
    participants: list[Participant] = []
    for position, section in enumerate(sections):
        kind = PARTICIPANT_SECTIONS.get(" ".join(section["name"].split()).lower())
        if kind:
            end = sections[position + 1].start() if position + 1 < len(sections) else len(text)
            participants.extend(parse_participants(text[section.end() : end], kind))
    return participants
