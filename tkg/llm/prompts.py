"""Prompt templates (prompts/*.j2), rendered apart from any transport.

Each template has an `instructions` block (static: rules, definitions, examples) and an
`input` block (the document and items at hand). Instructions go first in every request, so
providers' prompt caching applies to them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from tkg.core.paths import prompts_dir

# The template of each LLM task (its usage counter): prompts/<name>.
TEMPLATES = {
    "statements": "statement_extraction.j2",
    "validity": "validity_extraction.j2",
    "triplets": "triplet_extraction.j2",
    "figures": "figure_extraction.j2",
    "judge": "invalidation_judge.j2",
    "planner": "retrieval_planner.j2",
}


@dataclass(frozen=True)
class RenderedPrompt:
    instructions: str
    input: str
    template_sha256: str


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(prompts_dir())), undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False, autoescape=False,
    )


@lru_cache(maxsize=16)
def template_sha256(name: str) -> str:
    return hashlib.sha256((prompts_dir() / name).read_bytes()).hexdigest()


def render(name: str, **variables: object) -> RenderedPrompt:
    """Render both blocks of `prompts/<name>`; a missing variable is an error, not a blank."""
    template = _environment().get_template(name)
    context = template.new_context(variables)
    blocks = {block: "".join(template.blocks[block](context)).strip() for block in ("instructions", "input")}
    return RenderedPrompt(blocks["instructions"], blocks["input"], template_sha256(name))
