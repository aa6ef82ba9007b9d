"""Names as they are spoken in the call: mentions of the participants in the forms the operator
and the speakers use ('Matt Ramsay' for Matthew D. Ramsay, 'Joe Moore', a surname misspelt).

Three kinds of phrase name someone:
- **operator introductions**: 'Our next question comes from the line of Joe Moore with Morgan
  Stanley.', 'It is now my pleasure to introduce your host, Laura Graves.';
- **self-introductions**: 'This is Marilyn Mora, Head of Investor Relations.';
- **'in for'**: 'This is Jim Kelleher calling in for Sumit Dhanda.'

Each spoken form is linked to the participant it names, in this order:
1. **by speaker turn**: whom the operator introduces speaks next, and who introduces themselves
   is the turn's speaker; the form links when its surname agrees with theirs (a spelling slip
   within a small edit distance) or its given name does and the surnames are close;
2. **by the call's participants list**: otherwise the one participant whose name the form
   matches by the nickname and initial rules ('Bob' = 'Robert', 'R.' = 'Robert', 'Jen' =
   'Jensen'); none or several, and the form stays unlinked (counted).
A speaker's first name alone ('This is Darin', 'calling in for Harlan') is a mention within its
call; only forms of two words or more become aliases (sql/entity_aliases.sql).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nameparser import HumanName
from rapidfuzz import fuzz

from tkg.core.names import fold

_TOKEN = r"[A-Z][\w'’-]*"
NAME = rf"(?:(?:Mr|Mrs|Ms|Dr)\.?\s+)?(?P<name>{_TOKEN}(?:\s+[A-Z]\.)?(?:\s+(?:de |van |von |di |da )?{_TOKEN}){{1,2}})"
_OPERATOR = [
    re.compile(rf"\b(?:question|questioner|questions|caller)\b[^.?!]{{0,40}}?\b(?:from|of)\s+(?:the line of\s+)?{NAME}"),
    re.compile(rf"\b(?:we'll|we will|let's|we'll now)\s+(?:hear|go|take)\b[^.?!]{{0,25}}?\b(?:from|to)\s+{NAME}"),
    re.compile(rf"\b(?:introduce|over to|turn it to|hand it to)\s+(?:your\s+host(?:ess)?(?:\s+for today's call)?,?\s+|today's host,?\s+)?{NAME}"),
    re.compile(rf"^(?:(?:Thank you|Thanks)\.\s+)?{NAME},?\s+(?:with|from|of)\s+[A-Z]"),
]
# A speaker often says a first name only ('This is Darin', 'calling in for Harlan'): such a form
# is linked within its call, but never becomes an alias (a first name names nobody across calls).
SHORT_NAME = rf"(?P<name>{_TOKEN}(?:\s+[A-Z]\.)?(?:\s+{_TOKEN}){{0,2}})"
_SELF = re.compile(rf"\b(?:[Tt]his is|[Ii]t's|[Ii]t is|[Hh]i,? it's)\s+{SHORT_NAME}")
_IN_FOR = re.compile(rf"\b(?:in for|on behalf of)\s+{SHORT_NAME}")
# Capitalised words that begin a phrase, not a name ('This is Bank of America', 'Our next question').
_NOT_NAMES = {"the", "our", "your", "this", "that", "bank", "morgan", "goldman", "credit", "operator", "thank", "thanks",
              "ladies", "good", "next", "first", "final", "last", "question", "and", "it", "we", "i"}


@dataclass(frozen=True)
class SpokenForm:
    spoken: str  # the name as said
    kind: str  # 'operator', 'self' or 'in_for'
    target: str | None  # whom the turn points at: the next speaker, this turn's speaker, or nobody ('in_for')


def _given_and_surname(name: str) -> tuple[list[str], str]:
    parsed = HumanName(name)
    given = [fold(part) for part in (parsed.first, *parsed.middle_list) if part]
    return [g for g in given if g], fold(parsed.last or name.split()[-1])


def _given_agree(a: str, b: str) -> bool:
    """'Bob' and 'Robert', 'R' and 'Robert', 'Jen' and 'Jensen', 'Matt' and 'Matthew'."""
    from tkg.resolve.resolution import _nickname_match  # the resolver's own nickname table

    if not a or not b:
        return False
    if a == b or (len(a) == 1 and b.startswith(a)) or (len(b) == 1 and a.startswith(b)):
        return True
    if min(len(a), len(b)) >= 3 and (a.startswith(b) or b.startswith(a)):
        return True
    return _nickname_match(a, b) or _nickname_match(b, a)


def names_agree(spoken: str, full: str, turn: bool) -> bool:
    """Whether `spoken` can name the person listed as `full`. With the turn's evidence a close
    surname is enough ('Vivek Aria' for 'Vivek Arya'); from the list alone the surname must be
    the same and the given names agree by the nickname and initial rules."""
    given, surname = _given_and_surname(spoken)
    full_given, full_surname = _given_and_surname(full)
    if len(spoken.split()) == 1:  # a first name alone: its given name must agree
        return any(_given_agree(fold(spoken), other) for other in full_given)
    first_agrees = bool(given) and any(_given_agree(given[0], other) for other in full_given)
    if surname == full_surname:
        return turn or first_agrees
    if turn:
        closeness = fuzz.ratio(surname, full_surname)
        return closeness >= 80 or (first_agrees and closeness >= 60)
    return False


def _plausible(name: str, kind: str) -> bool:
    """Two words or more from the operator; a speaker's own first name, or the colleague's they
    stand in for, may come alone, though not in capitals ('on behalf of ASML')."""
    words = name.split()
    if not words or fold(words[0]) in _NOT_NAMES or fold(words[-1]) in _NOT_NAMES:
        return False
    return len(words) >= 2 or (kind != "operator" and not words[0].isupper() and len(words[0]) > 2)


def spoken_forms(text: str, speaker: str | None, next_speaker: str | None) -> list[SpokenForm]:
    """The name forms a turn's text says, each with the speaker its phrase points at."""
    found: list[SpokenForm] = []
    if speaker == "Operator":
        for pattern in _OPERATOR:
            for match in pattern.finditer(text):
                found.append(SpokenForm(match["name"], "operator", next_speaker))
    else:
        for match in _SELF.finditer(text):
            found.append(SpokenForm(match["name"], "self", speaker))
        for match in _IN_FOR.finditer(text):
            found.append(SpokenForm(match["name"], "in_for", None))
    seen, kept = set(), []
    for form in found:
        name = re.sub(r"[’']s$", "", form.spoken.strip())
        if _plausible(name, form.kind) and (name, form.kind) not in seen:
            seen.add((name, form.kind))
            kept.append(SpokenForm(name, form.kind, form.target))
    return kept


def link(form: SpokenForm, participants: list[str], company_people: list[str] = ()) -> tuple[str, str] | None:
    """The participant a spoken form names and how it was found: 'turn', 'participants', or for
    an 'in for' form, whose colleague is often off this call's list, 'company_participants' (the
    one person of the company's other calls the form matches)."""
    if form.target and form.target in participants and names_agree(form.spoken, form.target, turn=True):
        return form.target, "turn"
    matches = [name for name in participants if names_agree(form.spoken, name, turn=False)]
    if len(matches) == 1:
        return matches[0], "participants"
    if form.kind == "in_for" and not matches:
        matches = [name for name in company_people if names_agree(form.spoken, name, turn=False)]
        if len(matches) == 1:
            return matches[0], "company_participants"
    return None


def call_forms(chunks: list[dict]) -> list[tuple[str, SpokenForm]]:
    """The spoken forms of one call from its chunks in order (chunk_id, speaker, text, kind),
    each with its chunk: what a call's text says, whoever the participants turn out to be."""
    speakers = [chunk["speaker"] for chunk in chunks]
    forms = []
    for position, chunk in enumerate(chunks):
        speaker = chunk["speaker"]
        if not speaker or chunk.get("kind") == "participants":
            continue
        next_speaker = next((s for s in speakers[position + 1:] if s and s != speaker), None)
        forms.extend((chunk["chunk_id"], form) for form in spoken_forms(chunk["text"], speaker, next_speaker))
    return forms


def linked_forms(forms: list[tuple[str, SpokenForm]], participants: list[str],
                 company_people: list[str] = ()) -> tuple[list[dict], int]:
    """One row per (chunk, form) of `call_forms` linked to a participant (or, for 'in for', to
    one of `company_people`, the participants of the company's calls), and how many forms
    stayed unlinked."""
    rows, unlinked = [], 0
    for chunk_id, form in forms:
        linked = link(form, participants, company_people)
        if linked is None:
            unlinked += 1
            continue
        rows.append({"chunk_id": chunk_id, "spoken": form.spoken, "kind": form.kind, "participant": linked[0],
                     "method": linked[1]})
    return rows, unlinked


def call_mentions(chunks: list[dict], participants: list[str], company_people: list[str] = ()) -> tuple[list[dict], int]:
    """Spoken-form mentions of one call from its chunks in order: its forms (`call_forms`) linked
    (`linked_forms`)."""
    return linked_forms(call_forms(chunks), participants, company_people)
