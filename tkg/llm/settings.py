"""Settings of the LLM path, and backend selection."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field

from tkg.core import policy
from tkg.core.policy import VOCABULARY_STAGES, vocabulary_fingerprint
from tkg.extract import figures

log = logging.getLogger(__name__)

DEFAULT_MODELS = {
    "statements": "gpt-4.1-mini",
    "validity": "gpt-4.1-mini",
    "triplets": "gpt-4.1-mini",
    "figures": "gpt-4.1-mini",
    "judge": "gpt-4.1-mini",
    "planner": "gpt-4.1",
}
# USD per million tokens: input, cached input, output (OpenAI list prices, standard tier).
DEFAULT_PRICES: dict[str, tuple[float, float, float]] = {
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "o4-mini": (1.10, 0.275, 4.40),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "text-embedding-3-large": (0.13, 0.13, 0.0),
    "text-embedding-3-small": (0.02, 0.02, 0.0),
}
FLEX_DISCOUNT = 0.5  # service_tier="flex" bills about half the standard price
BATCH_DISCOUNT = 0.5  # the Batch API bills half the standard price, for answers within 24 hours
LLM_MODES = ("sync", "batch")


@dataclass(frozen=True)
class LLMSettings:
    """Everything that shapes LLM requests. The API key is not part of it (see `api_key`)."""

    models: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MODELS))
    embedding_model: str = "text-embedding-3-large"
    embedding_dimensions: int = 256
    base_url: str | None = None
    api_mode: str = "responses"  # "responses" (Responses API parse) or "chat" (chat.completions + json_schema)
    temperature: float = 0.0
    service_tier: str | None = None  # e.g. "flex" for cheap batch work
    timeout_s: float = 120.0
    max_in_flight: int = 16  # the window while a model's budgets are unknown, and for servers that announce none
    paced_max_in_flight: int = 512  # the ceiling once the provider's rate-limit headers pace requests
    llm_mode: str = "sync"  # "sync": requests as they come; "batch": a stage's requests go out as Batch API jobs
    batch_poll_s: float = 30.0  # how often a pending batch is checked
    max_attempts: int = 8
    batch_size: int = 8  # statements per validity / triplet / figure request; 1 = one request per statement
    embedding_batch_size: int = 512
    prices: dict[str, tuple[float, float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))

    def model(self, stage: str) -> str:
        return self.models.get(stage, DEFAULT_MODELS.get(stage, "gpt-4.1-mini"))

    def fingerprint(self, stage: str) -> str:
        """What changes a stage's output besides the prompt and the input: model and sampling."""
        relevant = {"model": self.embedding_model if stage == "embeddings" else self.model(stage),
                    "temperature": self.temperature, "api_mode": self.api_mode}
        if stage == "embeddings":
            relevant["dimensions"] = self.embedding_dimensions
        if stage in VOCABULARY_STAGES:
            relevant["vocabulary"] = vocabulary_fingerprint()
        if stage == "judge":
            relevant["policy"] = policy.POLICY.fingerprint()
        if stage == "figures":  # the prompt lists the company's segments, and answers are checked against them
            relevant["segments"] = figures.segments_fingerprint()
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]

    def __post_init__(self) -> None:
        if self.llm_mode not in LLM_MODES:
            raise ValueError(f"TKG_LLM_MODE must be one of {LLM_MODES}, got {self.llm_mode!r}")

    def cost_usd(self, model: str, input_tokens: int, cached_tokens: int, output_tokens: int, batch: bool = False) -> float:
        """What OpenAI bills for these tokens of `model`: list price, half with flex or through
        the Batch API (`batch`). A model dated snapshot (gpt-4.1-mini-2025-04-14) is priced as its model."""
        price = self.prices.get(model)
        if price is None:
            base = next((name for name in sorted(self.prices, key=len, reverse=True) if model.startswith(name + "-")), None)
            price = self.prices.get(base) if base else None
        if price is None:
            return 0.0
        uncached = max(input_tokens - cached_tokens, 0)
        cost = (uncached * price[0] + cached_tokens * price[1] + output_tokens * price[2]) / 1_000_000
        if batch:
            return cost * BATCH_DISCOUNT
        return cost * (FLEX_DISCOUNT if self.service_tier == "flex" else 1.0)

    def describe(self) -> dict[str, object]:
        """For logs and metadata: everything but prices (and never a key, which is not here)."""
        shown = asdict(self)
        shown.pop("prices")
        return shown


def settings_from_env() -> LLMSettings:
    """LLMSettings from TKG_* variables (OPENAI_BASE_URL for the server)."""
    models = dict(DEFAULT_MODELS)
    for stage in models:
        models[stage] = os.environ.get(f"TKG_MODEL_{stage.upper()}", models[stage])
    prices = dict(DEFAULT_PRICES)
    if os.environ.get("TKG_PRICES"):
        with open(os.environ["TKG_PRICES"]) as handle:
            prices.update({model: tuple(values) for model, values in json.load(handle).items()})
    return LLMSettings(
        models=models,
        embedding_model=os.environ.get("TKG_EMBEDDING_MODEL", "text-embedding-3-large"),
        embedding_dimensions=int(os.environ.get("TKG_EMBEDDING_DIMENSIONS", "256")),
        base_url=os.environ.get("OPENAI_BASE_URL") or None,
        api_mode=os.environ.get("TKG_API_MODE", "responses"),
        service_tier=os.environ.get("TKG_SERVICE_TIER") or None,
        timeout_s=float(os.environ.get("TKG_LLM_TIMEOUT", "120")),
        max_in_flight=int(os.environ.get("TKG_MAX_IN_FLIGHT", "16")),
        paced_max_in_flight=int(os.environ.get("TKG_PACED_MAX_IN_FLIGHT", "512")),
        llm_mode=(os.environ.get("TKG_LLM_MODE") or "sync").strip().lower(),
        batch_poll_s=float(os.environ.get("TKG_BATCH_POLL_S", "30")),
        max_attempts=int(os.environ.get("TKG_LLM_ATTEMPTS", "8")),
        batch_size=int(os.environ.get("TKG_BATCH_SIZE", "8")),
        prices=prices,
    )


def choose_backend(explicit: str | None = None, base_url: str | None = None) -> str:
    """'openai' or 'offline': TKG_LLM (or `explicit`) if set; else openai when OPENAI_API_KEY is
    set or a server is configured (`base_url` or OPENAI_BASE_URL); else offline."""
    choice = (explicit or os.environ.get("TKG_LLM") or "").strip().lower()
    if not choice:
        if os.environ.get("OPENAI_API_KEY"):
            choice, reason = "openai", "OPENAI_API_KEY is set"
        elif base_url or os.environ.get("OPENAI_BASE_URL"):
            choice, reason = "openai", "an OpenAI-compatible server is configured (base_url / OPENAI_BASE_URL)"
        else:
            choice, reason = "offline", "no OPENAI_API_KEY, no OPENAI_BASE_URL and no TKG_LLM"
    else:
        reason = "TKG_LLM/explicit setting"
    if choice not in {"openai", "offline"}:
        raise ValueError(f"TKG_LLM must be 'openai' or 'offline', got {choice!r}")
    _log_once(f"tkg extraction backend: {choice} ({reason})")
    return choice


_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        log.info(message)


def choose_embeddings(explicit: str | None = None, backend: str = "offline") -> str:
    """'openai' or 'wordllama': TKG_EMBEDDINGS if set, else follows the extraction backend."""
    choice = (explicit or os.environ.get("TKG_EMBEDDINGS") or ("openai" if backend == "openai" else "wordllama")).lower()
    if choice not in {"openai", "wordllama"}:
        raise ValueError(f"TKG_EMBEDDINGS must be 'openai' or 'wordllama', got {choice!r}")
    _log_once(f"tkg statement embeddings: {choice}")
    return choice
