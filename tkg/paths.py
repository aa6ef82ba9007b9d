"""Where tkg's SQL and prompt templates live: the repository's `sql/` and `prompts/` folders
(a source checkout or editable install), or their copies packaged inside a wheel."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PACKAGE.parent / name, _PACKAGE / f"_{name}"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ folder next to {_PACKAGE}; reinstall tkg")


def sql_dir() -> Path:
    return _find("sql")


def prompts_dir() -> Path:
    return _find("prompts")


@lru_cache(maxsize=32)
def read_sql(relative: str) -> str:
    return (sql_dir() / relative).read_text()
