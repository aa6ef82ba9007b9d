"""Where tkg's own files live: the repository's `sql/` and `prompts/` folders (a source checkout
or editable install) or their copies packaged inside a wheel, and the package's `config/` and
`sample/` folders."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the `tkg` package
CONFIG_DIR = PACKAGE_DIR / "config"
SAMPLE_DIR = PACKAGE_DIR / "sample"


def _find(name: str) -> Path:
    for candidate in (PACKAGE_DIR.parent / name, PACKAGE_DIR / f"_{name}"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ folder next to {PACKAGE_DIR}; reinstall tkg")


def sql_dir() -> Path:
    return _find("sql")


def prompts_dir() -> Path:
    return _find("prompts")


@lru_cache(maxsize=32)
def read_sql(relative: str) -> str:
    return (sql_dir() / relative).read_text()
