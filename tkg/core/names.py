"""Name normalisation shared by extraction and entity resolution."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from cleanco.clean import (
    custom_basename,
    normalized,
    prepare_default_terms,
    strip_punct,
    strip_tail,
)

from tkg.core.companies import Company, load_companies

_PUNCTUATION = re.compile(r"[^\w\s]")


@lru_cache(maxsize=262144)
def fold(text: str) -> str:
    """Lower-case, strip accents and punctuation, collapse spaces: 'Crédit  Suisse,' -> 'credit suisse'."""
    if not text.isascii():  # ASCII has nothing to decompose
        text = unicodedata.normalize("NFKD", text)
        text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


@lru_cache(maxsize=1)
def _suffix_terms() -> dict[str, list[tuple[int, tuple[int, list[str]]]]]:
    """cleanco's default legal-suffix terms by their last word, each with its place in cleanco's order."""
    by_last: dict[str, list[tuple[int, tuple[int, list[str]]]]] = {}
    for position, (size, parts) in enumerate(prepare_default_terms()):
        if parts:
            by_last.setdefault(parts[-1], []).append((position, (size, parts)))
    return by_last


def basename(name: str) -> str:
    """`cleanco.basename`, given only the terms that can match.

    cleanco tries each of its ~800 terms against the end of the name in turn, which costs
    about 0.1 ms a name. A term can only match if its last word is one of the name's words
    (words are only ever removed), so only those terms are passed, in cleanco's order: the
    result is the same.
    """
    by_last = _suffix_terms()
    stripped = strip_tail(name)
    # cleanco's normalisation (casefold, accents, its own letter map) is lower() for ASCII
    words = {strip_punct(word) for word in (stripped.lower() if stripped.isascii() else normalized(stripped)).split()}
    terms = sorted(term for word in words for term in by_last.get(word, ()))
    if not terms:
        return strip_tail(" ".join(stripped.split()))  # what custom_basename returns when nothing matches
    return custom_basename(name, [term for _, term in terms])


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


# Words a firm's initials leave out: joiners, the research-division suffix and legal forms.
_NOT_INITIALS = frozenset({"of", "and", "the", "research", "division", "llc", "llp", "lp", "inc", "ltd", "co", "plc", "ag",
                           "sa", "corp", "incorporated", "corporation", "company", "limited", "lllp"})


def firm_key(name: str | None) -> frozenset[str]:
    """The words that name a firm, without legal suffixes and the words every bank's name has:
    'RBC Capital Markets, LLC, Research Division' -> {'rbc'}, 'Sanford C. Bernstein & Co., LLC.'
    -> {'sanford', 'c', 'bernstein'}. Two firms are one when one key holds the other (`same_firm`)."""
    from tkg.core.policy import POLICY  # the policy reads nothing from here; imported late to keep names light

    text = f" {fold(organisation_key(name or '') if name else '')} "
    for spelling, canonical in POLICY.firm_spellings:
        text = text.replace(f" {spelling} ", f" {canonical} ")
    words = frozenset(word for word in text.split() if word not in POLICY.firm_generic_words)
    # the initials of the full name, marked, so that 'SIG' is 'Susquehanna International Group'
    initials = "".join(word[0] for word in fold(name or "").split() if word not in _NOT_INITIALS)
    return words | {f"^{initials}"} if len(initials) >= 2 else words


def same_firm(a: frozenset[str], b: frozenset[str]) -> bool:
    """'Bernstein' and 'Sanford C. Bernstein': one key's words all in the other's; or one firm's
    only word is the other's initials ('SIG')."""
    words_a = {word for word in a if not word.startswith("^")}
    words_b = {word for word in b if not word.startswith("^")}
    if not words_a or not words_b:
        return False
    if words_a <= words_b or words_b <= words_a:
        return True
    return (len(words_a) == 1 and f"^{next(iter(words_a))}" in b) or (len(words_b) == 1 and f"^{next(iter(words_b))}" in a)
