"""Job titles to offices.

A participant's title ('Interim CEO, Executive VP & CFO') names several offices at once. Each
office becomes its own HOLDS_ROLE statement, and the office (role at organisation, e.g. 'CFO
of Intel Corporation') is the entity that successive holders share, which is what lets a new
CFO retire the old one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tkg.core import policy

# Offices that may name the organisation after them ('CEO of Google', 'CEO - Google Inc.').
_ORG_SUFFIX_OFFICES = policy.POLICY.offices

ROLE_START = re.compile(
    r"^(?:Interim|Acting|Co-?Founder|Founder|Chief|CEO|CFO|COO|CTO|CAO|President|Chairman|Chairwoman|Chair|"
    r"Executive|Senior|Sr\.?|Corporate|Group|Global|EVP|SVP|VP|Vice|Director|Non-Independent|Independent|"
    r"Member|Head|General|GM|Treasurer|Secretary|Controller|Managing|MD|Principal|Analyst|IR\b|Investor)",
    re.IGNORECASE,
)

_NORMALISE = [
    (re.compile(r"\bChief Executive Officer\b", re.I), "CEO"),
    (re.compile(r"\bChief Financial Officer\b", re.I), "CFO"),
    (re.compile(r"\bChief Operating Officer\b", re.I), "COO"),
    (re.compile(r"\bChief Technology Officer\b", re.I), "CTO"),
    (re.compile(r"\bChief Accounting Officer\b", re.I), "CAO"),
    (re.compile(r"\bExecutive Vice President\b|\bExecutive VP\b", re.I), "EVP"),
    (re.compile(r"\bSenior Vice President\b|\bSenior VP\b|\bSr\.? VP\b", re.I), "SVP"),
    (re.compile(r"\bVice President\b", re.I), "VP"),
    (re.compile(r"\bInvestor Relations\b", re.I), "IR"),
    (re.compile(r"\bSr\.?\s+Dir\.?(?=\s|$)", re.I), "Senior Director"),
    (re.compile(r"\bChairwoman\b|\bChairperson\b|\bChair\b(?!man)", re.I), "Chairman"),
    (re.compile(r"\bChairman of the Board\b", re.I), "Chairman"),
]
_QUALIFIERS = re.compile(r"^(Interim|Acting)\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Office:
    """One office from a title: 'CFO' held at `organization`, possibly with a qualifier."""

    role: str
    organization: str | None
    qualifier: str | None = None

    def office_name(self, default_organization: str) -> str:
        return f"{self.role} of {self.organization or default_organization}"

    def phrase(self) -> str:
        return f"{self.qualifier.lower()} {self.role}" if self.qualifier else self.role


def _fragments(title: str) -> list[str]:
    """Split a title on commas, '&' and 'and', re-joining pieces that do not start a new role."""
    pieces = re.split(r"(,\s*|\s+&\s+|\s+and\s+)", title)
    fragments: list[str] = []
    for index in range(0, len(pieces), 2):
        piece = re.sub(r"^(?:and|&)\s+", "", pieces[index].strip())  # 'CFO, and Treasurer'
        joiner = pieces[index - 1] if index else ""
        if not piece:
            continue
        if fragments and not ROLE_START.match(piece):
            fragments[-1] = f"{fragments[-1]}{joiner}{piece}"
        else:
            fragments.append(piece)
    return fragments


def parse_offices(title: str | None, organization: str | None = None) -> list[Office]:
    """The offices a title names, in order, without duplicates.

    >>> [o.role for o in parse_offices("Interim CEO, Executive VP & CFO")]
    ['CEO', 'EVP', 'CFO']
    >>> parse_offices("Director & CEO of Google")[1]
    Office(role='CEO', organization='Google', qualifier=None)
    """
    if not title or not title.strip(" -"):
        return []
    offices: list[Office] = []
    for fragment in _fragments(" ".join(title.split())):
        text = fragment
        for pattern, replacement in _NORMALISE:
            text = pattern.sub(replacement, text)
        qualifier = None
        if match := _QUALIFIERS.match(text):
            qualifier, text = match[1].title(), text[match.end() :]
        office_org = organization
        head = re.match(r"^(CEO|CFO|COO|CTO|CAO|President|Chairman)\s*(?:\bof\b|-|,)\s*(.+)$", text)
        if head and head[1] in _ORG_SUFFIX_OFFICES and not text.startswith("Chairman of the Management Board"):
            text, office_org = head[1], head[2].strip()
        if re.fullmatch(r"Executive Chairman|Chairman of the Board of Directors", text):
            text = "Chairman"
        if re.fullmatch(r"(Non-Independent |Independent )?Director", text):
            text = "Director"
        office = Office(role=text.strip(" -"), organization=office_org, qualifier=qualifier)
        if office.role and office not in offices:
            offices.append(office)
    return offices
