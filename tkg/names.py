"""Name normalisation shared by extraction and entity resolution."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from cleanco import basename

from tkg.companies import Company, load_companies


_PUNCTUATION = re.compile(r"[^\w\s]")


@lru_cache(maxsize=262144)
def fold(text: str) -> str:
    """Lower-case, strip accents and punctuation, collapse spaces: 'Crédit  Suisse,' -> 'credit suisse'."""
    if not text.isascii():  # ASCII has nothing to decompose
        text = unicodedata.normalize("NFKD", text)
        text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


@lru_cache(maxsize=65536)
def organisation_key(name: str) -> str:
    """A company name without legal suffixes: 'Intel Corp.' and 'Intel Corporation' -> 'intel'."""
    stripped = re.sub(r",?\s*(Research Division|Research Arm)\s*$", "", name, flags=re.I)
    for _ in range(3):  # 'ASML Holding N.V.' needs two passes: 'N.V.' then 'Holding'
        shorter = basename(stripped)
        if not shorter or shorter == stripped:
            break
        stripped = shorter
    key = fold(stripped)
    key = re.sub(r"\b(holdings?|group|the)\b", " ", key)
    return " ".join(key.split()) or fold(name)


@lru_cache(maxsize=1)
def _company_keys() -> dict[str, Company]:
    keys: dict[str, Company] = {}
    for company in load_companies().values():
        for name in (company.name, company.ticker, *company.aliases):
            keys.setdefault(organisation_key(name), company)
    return keys


def company_for_name(name: str | None) -> Company | None:
    """The configured company a name refers to ('AMD', 'Advanced Micro Devices, Inc.'), if any."""
    if not name:
        return None
    return _company_keys().get(organisation_key(name))
