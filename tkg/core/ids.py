"""Content hashes. Every id tkg writes (statements, chunks, triplets, figures, entities) and
every short version string is a hash of what it names, so rebuilding a partition, or building
partitions in any order, gives the same ids."""

from __future__ import annotations

import hashlib


def short_hash(*parts: object, length: int = 20, separator: str = "\x1f") -> str:
    """The first `length` hex digits of the sha256 of `parts` joined by `separator`."""
    return hashlib.sha256(separator.join(str(part) for part in parts).encode("utf-8")).hexdigest()[:length]


def short_version(*parts: object) -> str:
    """A 16-digit version string of what shapes a stage's output (its rule set, settings, models)."""
    return short_hash(*parts, length=16, separator=":")
