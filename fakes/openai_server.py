"""A local OpenAI-compatible HTTP server for tests and benchmarks.

Point the real ``openai`` SDK at it through ``base_url`` and it answers
``POST /v1/responses``, ``POST /v1/chat/completions``, ``POST /v1/embeddings``
and ``GET /v1/models`` in the OpenAI wire format, while behaving like a real
provider: per-request latency, a concurrency limit answered with HTTP 429 +
``Retry-After``, injected faults (random or scripted), token accounting with
simulated prompt caching, and counters readable from Python or ``GET /_stats``.
A server in another process is controlled over HTTP: ``POST /_reset`` zeroes the
counters, ``POST /_configure`` with a JSON object changes provider settings.

    with OpenAICompatibleServer(responder=my_responder, latency_s=0.3) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="test")
        client.responses.parse(model="gpt-4.1-mini", input="...", text_format=MyModel)

Or as a separate process (default responder)::

    python -m fakes.openai_server --port 8765 --latency 0.3 --max-in-flight 32

Token counting (there is no tokenizer offline, tiktoken is not available):
``approx_tokens(text) == ceil(len(text) / 4)``, the usual "4 characters per
token" rule of thumb for English with OpenAI tokenizers. Input tokens are
counted over ``ParsedRequest.rendered_prompt``: the tools and the structured
output format (name + JSON schema) as sent, then the instructions and every
message / input item, joined by blank lines. Output tokens are counted over the
returned text. Prompt caching is simulated per model: ``cached_tokens`` is the
longest prefix of the rendered prompt, in whole ``cache_block_tokens`` (1024)
blocks, that an earlier successful request to the same model already sent.

Two provider models. ``mode="slots"`` (the default, what the older benchmarks used): every
request takes ``latency_s`` and at most ``max_in_flight`` are served at once, 429 beyond.
``mode="realistic"`` (:func:`realistic_settings`): an answer takes ``ttft_s`` plus its output
tokens at ``output_tokens_per_s`` (defaults: gpt-4.1-mini as measured by Artificial Analysis),
and each model has requests- and tokens-per-minute budgets (``rpm``, ``tpm``) that refill
continuously; every answer carries OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,
tokens}`` headers, and a request over a budget gets OpenAI's 429 body ("Rate limit reached for
... on tokens per min (TPM): Limit L, Used U, Requested R. Please try again in 1.2s ...") with
``retry-after-ms`` and ``retry-after``. A request costs its input tokens plus its max-tokens
cap on arrival; without a cap its output tokens are charged when known.

Batch API: ``POST /v1/files`` (purpose ``batch``), ``POST /v1/batches``, ``GET
/v1/batches/{id}``, ``POST /v1/batches/{id}/cancel`` and ``GET /v1/files/{id}/content``. A batch
is answered ``batch_completion_s`` after creation (outside the rate limits), with an output
file and an error file (``p_batch_line_error`` of its lines, seeded); ``queue_batch_outcomes``
makes the next batches expire, get cancelled or fail.

Function calling: a responder may return a :class:`FunctionCall` (or a list of
them, or a :class:`ModelTurn` with text and calls) to make the "model" call tools
the request offered; the answer carries ``function_call`` output items (Responses
API) or ``tool_calls`` (chat completions). The outputs the client sends back are
read with :func:`tool_outputs`.

The server never reads, logs or stores request headers, so the API key the
client sends goes nowhere.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import copy
import dataclasses
import email.parser
import email.policy
import hashlib
import inspect
import json
import logging
import math
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Union

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MODELS",
    "FAULT_KINDS",
    "Fault",
    "FunctionCall",
    "ModelTurn",
    "OpenAICompatibleServer",
    "ParsedRequest",
    "ProviderSettings",
    "Responder",
    "ServerStats",
    "approx_tokens",
    "default_responder",
    "embedding_vector",
    "minimal_instance",
    "parse_request",
    "schema_violation_instance",
    "tool_outputs",
]

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
DEFAULT_MODELS = (
    "gpt-4.1-mini",
    "gpt-4.1-nano",
    "gpt-4o-mini",
    "gpt-5-mini",
    "text-embedding-3-small",
    "text-embedding-3-large",
)
# Native vector sizes of OpenAI embedding models; anything else gets 1536.
EMBEDDING_DIMS = {"text-embedding-3-large": 3072, "text-embedding-3-small": 1536, "text-embedding-ada-002": 1536}
DEFAULT_EMBEDDING_DIM = 1536

FAULT_KINDS = ("429", "500", "timeout", "garbage", "schema_violation")
# Faults that corrupt the generated text; they only make sense for the generation endpoints.
CONTENT_FAULTS = frozenset({"garbage", "schema_violation"})
GARBAGE_TEXT = 'Sure! here is the JSON you asked for: {"'
GENERATION_ENDPOINTS = ("responses", "chat.completions")
_BACKLOG = 4096
FAKE_ORGANIZATION = "org-tkg-fake"
BATCH_OUTCOMES = ("completed", "expired", "cancelled", "failed")
# OpenAI's documented limits of one batch input file.
BATCH_MAX_REQUESTS = 50_000
BATCH_MAX_BYTES = 200 * 1024 * 1024
BATCH_ENDPOINTS = {"/v1/responses": "responses", "/v1/chat/completions": "chat.completions"}


def max_output_tokens(body: Mapping[str, Any]) -> int | None:
    """The cap on generated tokens a request sets (any of the APIs' three names), or None."""
    for name in ("max_output_tokens", "max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def approx_tokens(text: str) -> int:
    """Approximate OpenAI token count of ``text``: ``ceil(len(text) / 4)``.

    Deterministic and tokenizer-free; within ~20% of tiktoken for English prose.
    """
    return math.ceil(len(text) / CHARS_PER_TOKEN)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ParsedRequest:
    """What a responder sees of one generation (or embedding) request.

    ``endpoint`` is ``"responses"``, ``"chat.completions"`` or ``"embeddings"``.
    ``format_type`` is ``"text"``, ``"json_object"`` or ``"json_schema"``;
    ``schema_name`` / ``schema`` are set for ``json_schema`` only.
    ``messages`` are ``(role, text)`` pairs in prompt order, instructions first.
    ``input_text`` is the instructions and all message texts joined by blank
    lines (search it for markers); ``rendered_prompt`` additionally starts with
    the tools and format as sent, and is what input tokens are counted over.
    ``body`` is the decoded JSON body, untouched.
    """

    endpoint: str
    model: str
    format_type: str
    schema_name: str | None
    schema: dict[str, Any] | None
    messages: tuple[tuple[str, str], ...]
    input_text: str
    rendered_prompt: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class FunctionCall:
    """A tool call the "model" makes: a function the request offered in ``tools``, with its
    arguments (a dict, or the JSON text itself). ``call_id`` is generated when not given."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    call_id: str | None = None

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ModelTurn:
    """A whole assistant turn: text (may be empty) and the function calls made with it."""

    text: str = ""
    function_calls: tuple[FunctionCall, ...] = ()


Responder = Callable[[ParsedRequest], Union[str, Mapping[str, Any], FunctionCall, ModelTurn,
                                            Awaitable[Union[str, Mapping[str, Any], FunctionCall, ModelTurn]]]]


def tool_outputs(request: ParsedRequest) -> list[tuple[str, str]]:
    """``(call_id, output)`` of every tool result the client sent back, in order: the
    ``function_call_output`` input items (Responses API) or the ``tool`` messages (chat)."""
    if request.endpoint == "responses":
        items = request.body.get("input") if isinstance(request.body.get("input"), list) else []
        return [(str(item.get("call_id")), _content_text(item.get("output"))) for item in items
                if isinstance(item, dict) and item.get("type") == "function_call_output"]
    if request.endpoint == "chat.completions":
        return [(str(message.get("tool_call_id")), _content_text(message.get("content")))
                for message in request.body.get("messages") or [] if isinstance(message, dict) and message.get("role") == "tool"]
    return []


def _offered_tools(body: Mapping[str, Any]) -> set[str]:
    """Names of the functions a request offers (both wire shapes)."""
    names = set()
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "function":
            names.add(str(tool.get("name") or (tool.get("function") or {}).get("name")))
    return names


def _as_turn(result: Any, body: Mapping[str, Any]) -> ModelTurn | None:
    """A responder's result as a turn with function calls, or None when it is plain text/JSON."""
    if isinstance(result, FunctionCall):
        result = ModelTurn(function_calls=(result,))
    elif isinstance(result, (list, tuple)) and result and all(isinstance(item, FunctionCall) for item in result):
        result = ModelTurn(function_calls=tuple(result))
    if not isinstance(result, ModelTurn):
        return None
    offered = _offered_tools(body)
    calls = []
    for call in result.function_calls:
        if call.name not in offered:
            raise ValueError(f"the responder called {call.name!r}, which the request does not offer (tools: {sorted(offered)})")
        calls.append(call if call.call_id else dataclasses.replace(call, call_id=_new_id("call_")))
    return ModelTurn(result.text, tuple(calls))


class BadRequest(ValueError):
    """The request body is not something the OpenAI API would accept (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts with ``text``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
            else:  # images, files, audio: count what was sent
                texts.append(_compact(part))
        return "\n".join(texts)
    return _compact(content)


def _responses_messages(instructions: Any, input_: Any) -> list[tuple[str, str]]:
    """(role, text) pairs of a Responses API request, instructions first."""
    messages: list[tuple[str, str]] = []
    if isinstance(instructions, str):
        messages.append(("developer", instructions))
    elif isinstance(instructions, list):
        messages.extend(_responses_messages(None, instructions))
    if isinstance(input_, str):
        messages.append(("user", input_))
    elif isinstance(input_, list):
        for item in input_:
            if not isinstance(item, dict):
                messages.append(("user", _content_text(item)))
            elif "content" in item:
                messages.append((str(item.get("role", "user")), _content_text(item["content"])))
            elif item.get("type") == "function_call_output":
                messages.append(("tool", _content_text(item.get("output"))))
            elif item.get("type") == "function_call":
                messages.append(("assistant", f"{item.get('name', '')}({item.get('arguments', '')})"))
            else:  # reasoning items, item references, ...: count what was sent
                messages.append((str(item.get("type", "item")), _compact(item)))
    return messages


def _chat_messages(raw: Any) -> list[tuple[str, str]]:
    """(role, text) pairs of a Chat Completions ``messages`` list."""
    messages = []
    for message in raw:
        if not isinstance(message, dict):
            raise BadRequest("Each message must be an object.", "messages")
        text = _content_text(message.get("content"))
        if message.get("tool_calls"):
            text = "\n".join(filter(None, [text, _compact(message["tool_calls"])]))
        messages.append((str(message.get("role", "user")), text))
    return messages


def _format_of(fmt: Any, schema_holder: Any) -> tuple[str, str | None, dict[str, Any] | None]:
    """(format_type, schema_name, schema) from a text/response format object."""
    if not isinstance(fmt, dict):
        return "text", None, None
    kind = fmt.get("type", "text")
    if kind != "json_schema":
        return str(kind), None, None
    if not isinstance(schema_holder, dict) or not isinstance(schema_holder.get("schema"), dict):
        raise BadRequest("A json_schema format needs a 'schema' object.", "format")
    return "json_schema", schema_holder.get("name"), schema_holder["schema"]


def parse_request(endpoint: str, body: Mapping[str, Any]) -> ParsedRequest:
    """Decode a request body for ``endpoint`` into a :class:`ParsedRequest`.

    Raises :class:`BadRequest` for bodies the real API would reject with 400.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    fmt_json = ""
    if endpoint == "responses":
        if "input" not in body and "instructions" not in body:
            raise BadRequest("Missing required parameter: 'input'.", "input")
        fmt = (body.get("text") or {}).get("format")
        format_type, schema_name, schema = _format_of(fmt, fmt)
        messages = _responses_messages(body.get("instructions"), body.get("input"))
    elif endpoint == "chat.completions":
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("Missing required parameter: 'messages'.", "messages")
        fmt = body.get("response_format")
        format_type, schema_name, schema = _format_of(fmt, (fmt or {}).get("json_schema"))
        messages = _chat_messages(body["messages"])
    elif endpoint == "embeddings":
        fmt, format_type, schema_name, schema = None, "text", None, None
        messages = [("input", text) for text, _ in _embedding_inputs(body.get("input"))]
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}")
    if format_type == "json_schema":
        fmt_json = _compact(fmt)
    input_text = "\n\n".join(text for _, text in messages if text)
    # The provider renders tool and format definitions ahead of the conversation,
    # so they are part of the cacheable prefix.
    tools_json = _compact(body["tools"]) if body.get("tools") else ""
    rendered = "\n\n".join(part for part in (tools_json, fmt_json, input_text) if part)
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        format_type=format_type,
        schema_name=schema_name,
        schema=schema,
        messages=tuple(messages),
        input_text=input_text,
        rendered_prompt=rendered,
        body=body,
    )


def _embedding_inputs(raw: Any) -> list[tuple[str, int]]:
    """(text, token_count) per embedding input: strings, or token-id arrays."""
    if isinstance(raw, str):
        raw = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        raw = [raw]  # a single token array
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'input' must be a non-empty string or array.", "input")
    inputs = []
    for item in raw:
        if isinstance(item, str):
            if not item:
                raise BadRequest("'input' cannot contain an empty string.", "input")
            inputs.append((item, approx_tokens(item)))
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            inputs.append((" ".join(map(str, item)), len(item)))
        else:
            raise BadRequest("'input' items must be strings or arrays of token ids.", "input")
    return inputs


# --------------------------------------------------------------------------- schemas


def _resolve_ref(root: Mapping[str, Any], ref: str) -> Any:
    """Follow a local JSON pointer such as ``#/$defs/Company``."""
    if not ref.startswith("#"):
        raise ValueError(f"only local $refs are supported, got {ref!r}")
    node: Any = root
    for token in filter(None, ref[1:].split("/")):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def _allows_null(schema: Any, root: Mapping[str, Any]) -> bool:
    if not isinstance(schema, dict):
        return schema is True
    if "$ref" in schema:
        return _allows_null(_resolve_ref(root, schema["$ref"]), root)
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if "const" in schema:
        return schema["const"] is None
    if "enum" in schema:
        return None in schema["enum"]
    return any(_allows_null(b, root) for key in ("anyOf", "oneOf") for b in schema.get(key, []))


def _merge_all_of(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten ``allOf`` into one schema: union of properties and required, outer keys win."""
    merged: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for branch in [*schema["allOf"], {k: v for k, v in schema.items() if k != "allOf"}]:
        properties.update(branch.get("properties", {}))
        required.extend(r for r in branch.get("required", []) if r not in required)
        merged.update({k: v for k, v in branch.items() if k not in ("properties", "required")})
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


_STRING_FORMATS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "duration": "P0D",
    "email": "a@example.com",
    "uri": "https://example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "127.0.0.1",
}


def minimal_instance(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """Return a minimal JSON value that validates against ``schema``.

    Objects get only their required properties, arrays are empty (or
    ``minItems`` copies of a minimal item), strings are ``""`` (or a valid
    placeholder for common ``format``s / ``minLength``), numbers are 0 (clamped
    into their bounds), booleans are false, enums and consts give their first
    value, and anything nullable (``type: [.., "null"]``, ``anyOf``/``oneOf``
    with a null branch) is null. Local ``$ref``s (``#/$defs/...``) are resolved
    against ``root`` (default: ``schema`` itself). ``pattern`` is not honoured.
    """
    return _minimal(schema, schema if root is None else root, 0)


def _minimal(schema: Any, root: Mapping[str, Any], depth: int) -> Any:
    if depth > 64 or not isinstance(schema, dict):  # recursion guard; `true` schemas accept null
        return None
    if "$ref" in schema:
        return _minimal(_resolve_ref(root, schema["$ref"]), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if branches:
            if any(_allows_null(b, root) for b in branches):
                return None
            return _minimal(branches[0], root, depth + 1)
    if schema.get("allOf"):
        return _minimal(_merge_all_of(schema), root, depth + 1)

    kind = schema.get("type")
    if isinstance(kind, list):
        if "null" in kind or not kind:
            return None
        kind = kind[0]
    if kind is None:
        kind = "object" if ("properties" in schema or "required" in schema) else "array" if "items" in schema else "null"

    if kind == "object":
        properties = schema.get("properties", {})
        return {name: _minimal(properties.get(name, {}), root, depth + 1) for name in schema.get("required", [])}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        return [_minimal(schema.get("items", {}), root, depth + 1) for _ in range(count)]
    if kind == "string":
        if schema.get("format") in _STRING_FORMATS:
            return _STRING_FORMATS[schema["format"]]
        return "a" * int(schema.get("minLength", 0))
    if kind in ("integer", "number"):
        return _number_in_bounds(schema, integer=kind == "integer")
    if kind == "boolean":
        return False
    return None


def _number_in_bounds(schema: Mapping[str, Any], integer: bool) -> int | float:
    """0, moved into [minimum, maximum] (exclusive bounds step by 1)."""
    value: float = 0
    if schema.get("minimum") is not None:
        value = max(value, schema["minimum"])
    if schema.get("exclusiveMinimum") is not None and value <= schema["exclusiveMinimum"]:
        value = schema["exclusiveMinimum"] + 1
    if schema.get("maximum") is not None:
        value = min(value, schema["maximum"])
    if schema.get("exclusiveMaximum") is not None and value >= schema["exclusiveMaximum"]:
        value = schema["exclusiveMaximum"] - 1
    return math.ceil(value) if integer else value


def schema_violation_instance(schema: Mapping[str, Any] | None) -> Any:
    """Return valid JSON that does NOT validate against ``schema``.

    The minimal instance with its first required property removed (the typical
    LLM failure); if the schema has no required property, a value of the wrong type.
    """
    value = minimal_instance(schema) if schema is not None else None
    if isinstance(value, dict) and value:
        value.pop(next(iter(value)))
        return value
    return ["not", "an", "object"] if isinstance(value, dict) else {"unexpected": "object"}


def default_responder(request: ParsedRequest) -> str | dict[str, Any]:
    """Minimal valid instance of the requested schema; ``{}`` for json_object; ``"ok"`` for text."""
    if request.schema is not None:
        return minimal_instance(request.schema)
    if request.format_type == "json_object":
        return {}
    return "ok"


def _response_text(result: Any) -> str:
    """A responder's result as the text the model 'generated'."""
    if isinstance(result, str):
        return result
    if hasattr(result, "model_dump_json"):  # a pydantic model
        return result.model_dump_json()
    if isinstance(result, (Mapping, list)):
        return json.dumps(result, ensure_ascii=False)
    raise TypeError(f"responder must return str or dict, got {type(result).__name__}")


# --------------------------------------------------------------------------- embeddings


def embedding_vector(text: str, dimensions: int) -> np.ndarray:
    """Deterministic unit vector (float32) for ``text``, seeded by its SHA-256.

    Equal texts give equal vectors; different texts give near-orthogonal ones.
    A shorter ``dimensions`` is a renormalised prefix of a longer one, like the
    text-embedding-3 models.
    """
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimensions)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


# --------------------------------------------------------------------------- provider state


PROVIDER_MODES = ("slots", "realistic")
# gpt-4.1-mini on OpenAI as Artificial Analysis measured it (artificialanalysis.ai/models/
# gpt-4-1-mini/providers): 0.93 s to the first token, 77.2 output tokens per second.
REALISTIC_TTFT_S = 0.93
REALISTIC_OUTPUT_TOKENS_PER_S = 77.2
# OpenAI's published usage-tier-2 limits for gpt-4.1-mini (requests and tokens per minute).
REALISTIC_RPM = 5_000
REALISTIC_TPM = 2_000_000


def realistic_settings(**changes: Any) -> "ProviderSettings":
    """Provider settings of the realistic mode with its defaults (tier-2 gpt-4.1-mini), then `changes`."""
    return ProviderSettings(**{"mode": "realistic", "max_in_flight": None, "rpm": REALISTIC_RPM,
                               "tpm": REALISTIC_TPM, **changes})


@dataclass
class _Budget:
    """One per-minute budget (requests or tokens) of one model. It refills continuously at
    limit/60 per second up to the limit; `reset_s` is how long until it is full again, which is
    what OpenAI's x-ratelimit-reset-* headers announce."""

    limit: int
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.updated) * self.limit / 60.0)
        self.updated = now

    def reset_s(self) -> float:
        return max(0.0, self.limit - self.level) * 60.0 / self.limit

    def wait_s(self, cost: float) -> float:
        return max(0.0, cost - self.level) * 60.0 / self.limit


def duration_text(seconds: float) -> str:
    """A duration the way OpenAI's reset headers write it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


@dataclass(frozen=True)
class ProviderSettings:
    """Provider behaviour; read once per request, replaced atomically by ``configure``.

    ``max_in_flight=None`` means unlimited. ``fault_timeout_s`` is how long a
    scripted ``"timeout"`` fault stalls when the fault gives no ``seconds``.
    """

    latency_s: float = 0.0
    max_in_flight: int | None = 32
    retry_after_s: float = 1.0
    p_429: float = 0.0
    p_500: float = 0.0
    fault_timeout_s: float = 30.0
    prompt_caching: bool = True
    cache_block_tokens: int = 1024
    # "slots": every request takes latency_s, at most max_in_flight at once, 429 beyond.
    # "realistic": latency = ttft_s + output tokens / output_tokens_per_s (embeddings:
    # embedding_latency_s), requests- and tokens-per-minute budgets per model with OpenAI's
    # x-ratelimit-* headers on every answer; no concurrency limit unless max_in_flight is set.
    mode: str = "slots"
    ttft_s: float = REALISTIC_TTFT_S
    output_tokens_per_s: float = REALISTIC_OUTPUT_TOKENS_PER_S
    embedding_latency_s: float = 0.3
    rpm: int | None = None
    tpm: int | None = None
    # Batch API: how long a batch stays in_progress, and the seeded share of its lines that
    # come back in the error file (status 500) instead of the output file.
    batch_completion_s: float = 0.5
    p_batch_line_error: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in PROVIDER_MODES:
            raise ValueError(f"mode must be one of {PROVIDER_MODES}, got {self.mode!r}")
        if self.ttft_s < 0 or self.output_tokens_per_s <= 0 or self.embedding_latency_s < 0 or self.batch_completion_s < 0:
            raise ValueError("ttft_s, embedding_latency_s and batch_completion_s must be >= 0, output_tokens_per_s > 0")
        if (self.rpm is not None and self.rpm < 1) or (self.tpm is not None and self.tpm < 1):
            raise ValueError("rpm and tpm must be >= 1 or None")
        if not 0 <= self.p_batch_line_error <= 1:
            raise ValueError("p_batch_line_error must be a probability")
        if self.latency_s < 0 or self.retry_after_s < 0 or self.fault_timeout_s < 0:
            raise ValueError("latency_s, retry_after_s and fault_timeout_s must be >= 0")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1 or None")
        if not (0 <= self.p_429 <= 1 and 0 <= self.p_500 <= 1 and self.p_429 + self.p_500 <= 1):
            raise ValueError("p_429 and p_500 must be probabilities summing to at most 1")
        if self.cache_block_tokens < 1:
            raise ValueError("cache_block_tokens must be >= 1")


@dataclass(frozen=True)
class Fault:
    """One scripted fault. ``seconds`` applies to ``"timeout"`` only (how long to stall)."""

    kind: str
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; expected one of {FAULT_KINDS}")


@dataclass
class ServerStats:
    """Counters since the last ``reset_stats()``; ``stats()`` returns a copy.

    ``status_200`` counts every 200 sent, including garbage / schema-violation
    answers and timeouts whose client was still waiting. ``timeouts`` counts
    timeout faults served. ``input_tokens`` / ``output_tokens`` /
    ``cached_tokens`` cover generation endpoints; embeddings count in
    ``embedding_tokens``. ``in_flight`` is live, not reset.
    """

    requests: dict[str, int] = field(default_factory=dict)
    status_200: int = 0
    status_400: int = 0
    status_429_limit: int = 0
    status_429_injected: int = 0
    status_500: int = 0
    timeouts: int = 0
    garbage: int = 0
    schema_violations: int = 0
    responder_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    embedding_tokens: int = 0
    files_uploaded: int = 0
    batches_created: int = 0
    batch_lines: int = 0
    batch_line_errors: int = 0
    max_concurrency: int = 0
    in_flight: int = 0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def status_429(self) -> int:
        return self.status_429_limit + self.status_429_injected

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_requests": self.total_requests, "status_429": self.status_429}


# --------------------------------------------------------------------------- wire helpers


def _error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error body: ``{"error": {message, type, param, code}}``."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers={"x-request-id": _new_id("req_"), **(headers or {})})


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def _prefix_digests(text: str, block_chars: int) -> list[bytes]:
    """Digest of each whole-block prefix of ``text`` (block 1, blocks 1-2, ...)."""
    hasher = hashlib.blake2b(digest_size=16)
    digests = []
    for end in range(block_chars, len(text) + 1, block_chars):
        hasher.update(text[end - block_chars:end].encode("utf-8"))
        digests.append(hasher.digest())  # digest() does not finalise; keep extending
    return digests


# --------------------------------------------------------------------------- the server


class OpenAICompatibleServer:
    """OpenAI-compatible HTTP server on 127.0.0.1, run in a background thread.

    Use as a context manager (or ``start()`` / ``stop()``); ``base_url`` is
    ``http://127.0.0.1:PORT/v1``. Behaviour can be changed while it runs with
    ``configure(...)``, ``set_responder(...)`` and ``queue_faults(...)``; all
    shared state is guarded by one lock, so any thread may call them.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        max_in_flight: int | None = 32,
        retry_after_s: float = 1.0,
        p_429: float = 0.0,
        p_500: float = 0.0,
        seed: int = 0,
        fault_timeout_s: float = 30.0,
        prompt_caching: bool = True,
        cache_block_tokens: int = 1024,
        models: Iterable[str] = DEFAULT_MODELS,
        log_level: str = "warning",
        provider: ProviderSettings | None = None,
    ) -> None:
        self.host = host
        self._requested_port = port
        self._log_level = log_level
        self.models = tuple(models)
        self._lock = threading.Lock()
        self._settings = ProviderSettings(
            latency_s=latency_s, max_in_flight=max_in_flight, retry_after_s=retry_after_s, p_429=p_429,
            p_500=p_500, fault_timeout_s=fault_timeout_s, prompt_caching=prompt_caching,
            cache_block_tokens=cache_block_tokens,
        ) if provider is None else provider  # `provider` (e.g. realistic_settings()) replaces the keywords above
        self._responder: Responder = responder or default_responder
        self._rng = random.Random(seed)
        self._faults: collections.deque[Fault] = collections.deque()
        self._stats = ServerStats()
        self._seen_prefixes: dict[str, set[bytes]] = {}
        self._budget_state: dict[tuple[str, str, int], _Budget] = {}
        self._files: dict[str, dict[str, Any]] = {}
        self._batches: dict[str, dict[str, Any]] = {}
        self._batch_outcomes: collections.deque[str] = collections.deque()
        self._closing = threading.Event()
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port: int | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/models", self._list_models, methods=["GET"]),
                Route("/v1/models/{model:path}", self._get_model, methods=["GET"]),
                Route("/v1/files", self._upload_file, methods=["POST"]),
                Route("/v1/files/{file_id}", self._get_file, methods=["GET"]),
                Route("/v1/files/{file_id}/content", self._get_file_content, methods=["GET"]),
                Route("/v1/batches", self._create_batch, methods=["POST"]),
                Route("/v1/batches/{batch_id}", self._get_batch, methods=["GET"]),
                Route("/v1/batches/{batch_id}/cancel", self._cancel_batch, methods=["POST"]),
                Route("/_stats", self._get_stats, methods=["GET"]),
                Route("/_reset", self._post_reset, methods=["POST"]),
                Route("/_configure", self._post_configure, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_exception},
        )

    # ------------------------------------------------------------------ control

    @property
    def settings(self) -> ProviderSettings:
        with self._lock:
            return self._settings

    def configure(self, *, seed: int | None = None, **changes: Any) -> ProviderSettings:
        """Change provider behaviour (any ``ProviderSettings`` field) for requests arriving from now on.

        ``seed`` re-seeds the fault RNG. Returns the new settings.
        """
        with self._lock:
            self._settings = dataclasses.replace(self._settings, **changes)
            if seed is not None:
                self._rng = random.Random(seed)
            return self._settings

    def set_responder(self, responder: Responder | None) -> None:
        """Use ``responder`` for subsequent requests (``None``: the default responder)."""
        with self._lock:
            self._responder = responder or default_responder

    def queue_faults(self, *faults: str | int | Fault) -> None:
        """Append scripted faults, served FIFO to the next requests (ahead of random faults).

        ``"429"``, ``"500"`` and ``"timeout"`` hit any POST endpoint; ``"garbage"``
        and ``"schema_violation"`` wait for the next generation request.
        """
        parsed = [f if isinstance(f, Fault) else Fault(str(f)) for f in faults]
        with self._lock:
            self._faults.extend(parsed)

    def queue_batch_outcomes(self, *outcomes: str) -> None:
        """How the next batches created end, FIFO: ``"completed"``, ``"expired"`` (every line
        comes back in the error file with ``batch_expired``), ``"cancelled"`` or ``"failed"``."""
        unknown = set(outcomes) - set(BATCH_OUTCOMES)
        if unknown:
            raise ValueError(f"unknown batch outcome(s) {sorted(unknown)}; expected some of {BATCH_OUTCOMES}")
        with self._lock:
            self._batch_outcomes.extend(outcomes)

    def clear_faults(self) -> None:
        """Drop all scripted faults not yet served."""
        with self._lock:
            self._faults.clear()

    def pending_faults(self) -> list[Fault]:
        """Scripted faults not yet served, in order."""
        with self._lock:
            return list(self._faults)

    def stats(self) -> ServerStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return dataclasses.replace(self._stats, requests=dict(self._stats.requests))

    def reset_stats(self) -> None:
        """Zero all counters (``in_flight`` is live state and survives)."""
        with self._lock:
            in_flight = self._stats.in_flight
            self._stats = ServerStats(in_flight=in_flight, max_concurrency=in_flight)

    def clear_prompt_cache(self) -> None:
        """Forget every prompt prefix seen, so the next requests report no cached tokens."""
        with self._lock:
            self._seen_prefixes.clear()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (no ``/v1``); valid once started."""
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, what to pass to ``openai.OpenAI(base_url=...)``."""
        return self.url + "/v1"

    def _bind(self) -> socket.socket:
        # Binding (and listening) ourselves makes port 0 race-free: the port is known,
        # and connections queue in the kernel, before uvicorn starts accepting.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._requested_port))
        sock.listen(_BACKLOG)
        self.port = sock.getsockname()[1]
        return sock

    def _make_uvicorn(self, own_process: bool) -> uvicorn.Server:
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port or 0,
            # Inside a test process, leave the host's logging setup alone.
            log_config=uvicorn.config.LOGGING_CONFIG if own_process else None,
            log_level=self._log_level,
            access_log=False,  # keep request logging out entirely; nothing about clients is logged
            lifespan="off",
            timeout_graceful_shutdown=3,
            backlog=_BACKLOG,
        )
        return uvicorn.Server(config)

    def start(self, timeout_s: float = 10.0) -> "OpenAICompatibleServer":
        """Start serving in a daemon thread; return once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._closing.clear()
        self._socket = self._bind()
        self._uvicorn = self._make_uvicorn(own_process=False)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._socket]}, name=f"openai-server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("OpenAI-compatible test server failed to start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and join the thread; stalled ``timeout`` faults are cut short."""
        self._closing.set()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._uvicorn is not None:
                self._uvicorn.force_exit = True
                self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
        self._thread = self._uvicorn = self._socket = None

    def serve_forever(self) -> None:
        """Serve in the calling thread until SIGINT/SIGTERM (used by ``python -m``)."""
        self._socket = self._bind()
        self._uvicorn = self._make_uvicorn(own_process=True)
        print(f"OpenAI-compatible test server at {self.base_url}", flush=True)
        try:
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def __enter__(self) -> "OpenAICompatibleServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ request plumbing

    def _count(self, endpoint: str) -> None:
        with self._lock:
            self._stats.requests[endpoint] = self._stats.requests.get(endpoint, 0) + 1

    def _bump(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._stats, name, getattr(self._stats, name) + delta)

    def _admit(self, endpoint: str) -> tuple[bool, Fault | None, ProviderSettings]:
        """Take an in-flight slot (False if the limit is reached) and pick this request's fault."""
        with self._lock:
            settings = self._settings
            if settings.max_in_flight is not None and self._stats.in_flight >= settings.max_in_flight:
                return False, None, settings
            self._stats.in_flight += 1
            self._stats.max_concurrency = max(self._stats.max_concurrency, self._stats.in_flight)
            return True, self._next_fault(endpoint, settings), settings

    def _next_fault(self, endpoint: str, settings: ProviderSettings) -> Fault | None:
        # Caller holds the lock. Scripted faults come first, then one seeded draw.
        if self._faults and not (self._faults[0].kind in CONTENT_FAULTS and endpoint not in GENERATION_ENDPOINTS):
            return self._faults.popleft()
        draw = self._rng.random()
        if draw < settings.p_429:
            return Fault("429")
        if draw < settings.p_429 + settings.p_500:
            return Fault("500")
        return None

    def _rate_limited(self, settings: ProviderSettings, injected: bool) -> JSONResponse:
        self._bump(**{"status_429_injected" if injected else "status_429_limit": 1})
        retry = settings.retry_after_s
        reason = "injected fault" if injected else f"more than {settings.max_in_flight} requests in flight"
        return _error(
            429,
            f"Rate limit reached ({reason}). Please try again in {retry:g}s.",
            "rate_limit_error",
            code="rate_limit_exceeded",
            headers={"retry-after": f"{retry:g}", "retry-after-ms": str(round(retry * 1000))},
        )

    async def _read_body(self, request: Request, endpoint: str) -> dict[str, Any] | JSONResponse:
        """The JSON object body, or a 400 response."""
        self._count(endpoint)
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            self._bump(status_400=1)
            return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
        return body

    async def _stall(self, request: Request, seconds: float) -> bool:
        """Wait ``seconds``; False as soon as the client hangs up or the server stops."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._closing.is_set() or await request.is_disconnected():
                return False
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return True

    async def _serve(
        self, request: Request, endpoint: str,
        produce: Callable[[Fault | None, ProviderSettings], Awaitable[tuple[Response, int]]],
        model: str | None = None, estimate: int = 0, charge_output: bool = False,
    ) -> Response:
        """Apply admission, rate limits, latency and transport faults around ``produce`` (which
        answers the response and its output tokens). ``estimate`` is what the request costs
        the tokens budget on arrival; with ``charge_output`` its output tokens are charged too
        once they are known (a request without a max-tokens cap)."""
        admitted, fault, settings = self._admit(endpoint)
        if not admitted:
            return self._rate_limited(settings, injected=False)
        try:
            kind = fault.kind if fault else None
            if kind == "429":  # real rate limits answer before doing any work
                return self._rate_limited(settings, injected=True)
            realistic = settings.mode == "realistic"
            limit_headers: dict[str, str] = {}
            if realistic and model is not None:
                refused, limit_headers = self._spend(model, estimate, settings)
                if refused is not None:
                    return refused
            if not realistic and settings.latency_s:
                await asyncio.sleep(settings.latency_s)  # overlaps across concurrent requests
            if kind == "500":
                if realistic:
                    await asyncio.sleep(settings.ttft_s)
                self._bump(status_500=1)
                return _error(500, "The server had an error while processing your request. Sorry about that! "
                                   "(injected fault)", "server_error", headers=limit_headers)
            if kind == "timeout":
                self._bump(timeouts=1)
                seconds = fault.seconds if fault.seconds is not None else settings.fault_timeout_s
                if not await self._stall(request, seconds):
                    return Response(status_code=499)  # the client is gone; nobody reads this
            response, output_tokens = await produce(fault, settings)
            if realistic:
                if charge_output and model is not None and response.status_code == 200:
                    self._charge(model, output_tokens, settings)
                # The answer takes as long as its tokens take to generate (no streaming here).
                await asyncio.sleep(settings.embedding_latency_s if endpoint == "embeddings"
                                    else settings.ttft_s + output_tokens / settings.output_tokens_per_s)
            response.headers.update(limit_headers)
            return response
        finally:
            self._bump(in_flight=-1)

    # ------------------------------------------------------------------ per-minute budgets

    def _budgets(self, model: str, settings: ProviderSettings) -> list[tuple[str, _Budget]]:
        # Caller holds the lock. Keyed by limit too, so a reconfigured limit starts full.
        now, found = time.monotonic(), []
        for kind, limit in (("requests", settings.rpm), ("tokens", settings.tpm)):
            if limit is None:
                continue
            budget = self._budget_state.setdefault((model, kind, limit), _Budget(limit, float(limit), now))
            budget.refill(now)
            found.append((kind, budget))
        return found

    @staticmethod
    def _limit_headers(budgets: list[tuple[str, _Budget]]) -> dict[str, str]:
        headers = {}
        for kind, budget in budgets:
            headers[f"x-ratelimit-limit-{kind}"] = str(budget.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(budget.level)))
            headers[f"x-ratelimit-reset-{kind}"] = duration_text(budget.reset_s())
        return headers

    def _spend(self, model: str, estimate: int, settings: ProviderSettings) -> tuple[Response | None, dict[str, str]]:
        """Charge one request and ``estimate`` tokens to ``model``'s budgets, or refuse with the
        429 OpenAI sends; either way the x-ratelimit-* headers as they stand after it."""
        with self._lock:
            budgets = self._budgets(model, settings)
            for kind, budget in budgets:
                cost = 1 if kind == "requests" else estimate
                unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
                if cost > budget.limit:  # can never pass: OpenAI says so, without a retry hint
                    self._stats.status_429_limit += 1
                    return _error(429, f"Request too large for {model} in organization {FAKE_ORGANIZATION} on {unit}: "
                                       f"Limit {budget.limit}, Requested {cost}. The input or output tokens must be "
                                       "reduced in order to run successfully. Visit "
                                       "https://platform.openai.com/account/rate-limits to learn more.",
                                  kind, code="rate_limit_exceeded", headers=self._limit_headers(budgets)), {}
                if budget.level < cost:
                    self._stats.status_429_limit += 1
                    wait = budget.wait_s(cost)
                    used = budget.limit - max(0, math.floor(budget.level))
                    return _error(429, f"Rate limit reached for {model} in organization {FAKE_ORGANIZATION} on {unit}: "
                                       f"Limit {budget.limit}, Used {used}, Requested {cost}. Please try again in "
                                       f"{duration_text(wait)}. Visit https://platform.openai.com/account/rate-limits "
                                       "to learn more.",
                                  kind, code="rate_limit_exceeded",
                                  headers={**self._limit_headers(budgets), "retry-after-ms": str(math.ceil(wait * 1000)),
                                           "retry-after": str(max(1, math.ceil(wait)))}), {}
            for kind, budget in budgets:
                budget.level -= 1 if kind == "requests" else estimate
            return None, self._limit_headers(budgets)

    def _charge(self, model: str, tokens: int, settings: ProviderSettings) -> None:
        """Charge tokens known only after the answer (output without a cap) to the tokens budget."""
        with self._lock:
            for kind, budget in self._budgets(model, settings):
                if kind == "tokens":
                    budget.level -= tokens

    def _account(self, parsed: ParsedRequest, text: str, settings: ProviderSettings) -> tuple[int, int, int]:
        """Count a successful generation: (input_tokens, output_tokens, cached_tokens)."""
        input_tokens, output_tokens = approx_tokens(parsed.rendered_prompt), approx_tokens(text)
        digests = []
        if settings.prompt_caching:
            digests = _prefix_digests(parsed.rendered_prompt, settings.cache_block_tokens * CHARS_PER_TOKEN)
        with self._lock:
            seen = self._seen_prefixes.setdefault(parsed.model, set())
            hits = 0
            for digest in digests:
                if digest not in seen:
                    break
                hits += 1
            if len(seen) > 1_000_000:  # bound memory in long benchmarks
                seen.clear()
            seen.update(digests)
            cached = hits * settings.cache_block_tokens
            stats = self._stats
            stats.status_200 += 1
            stats.input_tokens += input_tokens
            stats.output_tokens += output_tokens
            stats.cached_tokens += cached
        return input_tokens, output_tokens, cached

    async def _generate_text(self, parsed: ParsedRequest, fault: Fault | None) -> str | ModelTurn | JSONResponse:
        """The assistant text for ``parsed`` (the responder's, or a content fault's), or the
        responder's turn when it calls functions."""
        if fault is not None and fault.kind == "garbage":
            self._bump(garbage=1)
            return GARBAGE_TEXT
        if fault is not None and fault.kind == "schema_violation":
            self._bump(schema_violations=1)
            return json.dumps(schema_violation_instance(parsed.schema))
        with self._lock:
            responder = self._responder
        try:
            result = responder(parsed)
            if inspect.isawaitable(result):
                result = await result
            turn = _as_turn(result, parsed.body)
            return turn if turn is not None and turn.function_calls else _response_text(turn.text if turn else result)
        except Exception as exc:  # a broken responder is a test bug: make it loud, and a 500
            log.exception("responder failed for %s request (model %s)", parsed.endpoint, parsed.model)
            self._bump(responder_errors=1, status_500=1)
            return _error(500, f"responder raised {type(exc).__name__}: {exc}", "server_error")

    async def _generation(self, request: Request, endpoint: str) -> Response:
        body = await self._read_body(request, endpoint)
        if isinstance(body, Response):
            return body
        try:
            parsed = parse_request(endpoint, body)
            if body.get("stream"):
                raise BadRequest("stream=true is not supported by the test server.", "stream")
        except BadRequest as exc:
            self._bump(status_400=1)
            return _error(400, str(exc), "invalid_request_error", param=exc.param)

        async def produce(fault: Fault | None, settings: ProviderSettings) -> tuple[Response, int]:
            text = await self._generate_text(parsed, fault)
            if isinstance(text, Response):
                return text, 0
            calls: tuple[FunctionCall, ...] = ()
            if isinstance(text, ModelTurn):
                text, calls = text.text, text.function_calls
            generated = "\n".join([text] * bool(text) + [f"{c.name}({c.arguments_json()})" for c in calls])
            usage = self._account(parsed, generated, settings)
            build = _responses_body if endpoint == "responses" else _chat_body
            return JSONResponse(build(parsed, text, *usage, calls=calls), headers={"x-request-id": _new_id("req_")}), usage[1]

        cap = max_output_tokens(body)
        return await self._serve(request, endpoint, produce, model=parsed.model,
                                 estimate=approx_tokens(parsed.rendered_prompt) + (cap or 0), charge_output=cap is None)

    # ------------------------------------------------------------------ endpoints

    async def _responses(self, request: Request) -> Response:
        return await self._generation(request, "responses")

    async def _chat_completions(self, request: Request) -> Response:
        return await self._generation(request, "chat.completions")

    async def _embeddings(self, request: Request) -> Response:
        body = await self._read_body(request, "embeddings")
        if isinstance(body, Response):
            return body
        try:
            parsed = parse_request("embeddings", body)
            inputs = _embedding_inputs(body.get("input"))
            dimensions = body.get("dimensions") or EMBEDDING_DIMS.get(parsed.model, DEFAULT_EMBEDDING_DIM)
            if not isinstance(dimensions, int) or dimensions < 1:
                raise BadRequest("'dimensions' must be a positive integer.", "dimensions")
            encoding = body.get("encoding_format", "float")
            if encoding not in ("float", "base64"):
                raise BadRequest("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
        except BadRequest as exc:
            self._bump(status_400=1)
            return _error(400, str(exc), "invalid_request_error", param=exc.param)

        async def produce(fault: Fault | None, settings: ProviderSettings) -> tuple[Response, int]:
            data = []
            # A responder may embed for real (e.g. with a local model), so similarity means something.
            embed = getattr(self._responder, "embed", None)
            vectors = embed([text for text, _ in inputs], dimensions) if embed else None
            for index, (text, _) in enumerate(inputs):
                vector = vectors[index] if vectors is not None else embedding_vector(text, dimensions)
                # The SDK asks for base64 unless the caller picks a format: little-endian float32 bytes.
                embedding: Any = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                                  if encoding == "base64" else vector.tolist())
                data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens = sum(count for _, count in inputs)
            self._bump(status_200=1, embedding_tokens=tokens)
            body_out = {"object": "list", "data": data, "model": parsed.model,
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
            return JSONResponse(body_out, headers={"x-request-id": _new_id("req_")}), 0

        return await self._serve(request, "embeddings", produce, model=parsed.model,
                                 estimate=sum(count for _, count in inputs))

    def _model_object(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 1_700_000_000, "owned_by": "tkg-testing"}

    async def _list_models(self, request: Request) -> Response:
        self._count("models")
        return JSONResponse({"object": "list", "data": [self._model_object(m) for m in self.models]})

    async def _get_model(self, request: Request) -> Response:
        self._count("models")
        model = request.path_params["model"]
        if model not in self.models:
            return _error(404, f"The model '{model}' does not exist", "invalid_request_error", code="model_not_found")
        return JSONResponse(self._model_object(model))

    async def _get_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats().to_dict())

    @staticmethod
    async def _json_object(request: Request) -> dict[str, Any] | None:
        """The request body as a JSON object ({} when empty), or None when it is not one."""
        try:
            value = json.loads(await request.body() or b"{}")
        except (ValueError, UnicodeDecodeError):
            return None
        return value if isinstance(value, dict) else None

    async def _post_reset(self, request: Request) -> Response:
        """``POST /_reset``: zero the counters; ``{"prompt_cache": true}`` also forgets cached prefixes,
        ``{"faults": true}`` drops scripted faults, ``{"rate_limits": true}`` refills every budget. Answers the counters as they were before."""
        options = await self._json_object(request)
        if options is None:
            return _error(400, "POST /_reset takes a JSON object (or no body).", "invalid_request_error")
        before = self.stats().to_dict()
        self.reset_stats()
        if options.get("prompt_cache"):
            self.clear_prompt_cache()
        if options.get("faults"):
            self.clear_faults()
        if options.get("rate_limits"):  # every per-minute budget full again, as after a quiet minute
            with self._lock:
                self._budget_state.clear()
        return JSONResponse(before)

    async def _post_configure(self, request: Request) -> Response:
        """``POST /_configure`` with a JSON object of ``ProviderSettings`` fields (and ``seed``),
        e.g. ``{"p_429": 0.2, "p_500": 0.05, "latency_s": 0.3, "seed": 1}``; answers the new settings."""
        changes = await self._json_object(request)
        if changes is None:
            return _error(400, "POST /_configure takes a JSON object of provider settings.", "invalid_request_error")
        known = {f.name for f in dataclasses.fields(ProviderSettings)} | {"seed"}
        unknown = sorted(set(changes) - known)
        if unknown:
            return _error(400, f"unknown setting(s) {unknown}; expected some of {sorted(known)}", "invalid_request_error")
        try:
            settings = self.configure(**changes)
        except (TypeError, ValueError) as exc:
            return _error(400, f"invalid settings: {exc}", "invalid_request_error")
        return JSONResponse(dataclasses.asdict(settings))

    # ------------------------------------------------------------------ files and batches

    def _file_object(self, file_id: str) -> dict[str, Any]:
        stored = self._files[file_id]
        return {"id": file_id, "object": "file", "bytes": len(stored["content"]), "created_at": stored["created_at"],
                "filename": stored["filename"], "purpose": stored["purpose"], "status": "processed",
                "expires_at": None, "status_details": None}

    def _store_file(self, content: bytes, filename: str, purpose: str) -> str:
        file_id = _new_id("file-")
        with self._lock:
            self._files[file_id] = {"content": content, "filename": filename, "purpose": purpose,
                                    "created_at": int(time.time())}
        return file_id

    async def _upload_file(self, request: Request) -> Response:
        """``POST /v1/files`` (multipart: ``purpose`` and ``file``), parsed with the standard
        library's MIME parser so the fake needs no multipart package."""
        self._count("files")
        raw = await request.body()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + request.headers.get("content-type", "").encode("latin-1") + b"\r\n\r\n" + raw)
        fields: dict[str, tuple[bytes, str | None]] = {}
        if message.is_multipart():
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                if name:
                    fields[str(name)] = (part.get_payload(decode=True) or b"", part.get_filename())
        if "file" not in fields or "purpose" not in fields:
            self._bump(status_400=1)
            return _error(400, "Uploading a file takes multipart fields 'file' and 'purpose'.", "invalid_request_error")
        content, filename = fields["file"]
        purpose = fields["purpose"][0].decode("utf-8", "replace")
        if purpose == "batch" and len(content) > BATCH_MAX_BYTES:
            self._bump(status_400=1)
            return _error(400, f"A batch input file may hold at most {BATCH_MAX_BYTES} bytes.", "invalid_request_error")
        file_id = self._store_file(content, filename or "upload.jsonl", purpose)
        self._bump(files_uploaded=1)
        return JSONResponse(self._file_object(file_id))

    async def _get_file(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        with self._lock:
            if file_id not in self._files:
                return _error(404, f"No such File object: {file_id}", "invalid_request_error")
            return JSONResponse(self._file_object(file_id))

    async def _get_file_content(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None:
            return _error(404, f"No such File object: {file_id}", "invalid_request_error")
        return Response(stored["content"], media_type="application/octet-stream")

    async def _create_batch(self, request: Request) -> Response:
        """``POST /v1/batches``: checks the input file the way OpenAI does (one endpoint, one
        model, unique custom_ids, at most 50,000 lines), then runs it after ``batch_completion_s``."""
        self._count("batches")
        body = await self._json_object(request)
        if body is None:
            return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
        endpoint, file_id = body.get("endpoint"), body.get("input_file_id")
        if endpoint not in BATCH_ENDPOINTS:
            return _error(400, f"endpoint must be one of {sorted(BATCH_ENDPOINTS)}", "invalid_request_error", param="endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be '24h'", "invalid_request_error", param="completion_window")
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None or stored["purpose"] != "batch":
            return _error(400, f"input_file_id {file_id!r} is not a file uploaded with purpose 'batch'",
                          "invalid_request_error", param="input_file_id")
        lines = [line for line in stored["content"].decode("utf-8").splitlines() if line.strip()]
        problems, seen, models = [], set(), set()
        for number, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
            except ValueError:
                problems.append(f"line {number}: not JSON")
                continue
            if item.get("custom_id") in seen:
                problems.append(f"line {number}: duplicate custom_id {item.get('custom_id')!r}")
            seen.add(item.get("custom_id"))
            if item.get("method") != "POST" or item.get("url") != endpoint:
                problems.append(f"line {number}: method must be POST and url {endpoint}")
            models.add((item.get("body") or {}).get("model"))
        if len(lines) > BATCH_MAX_REQUESTS:
            problems.append(f"{len(lines)} requests; a batch holds at most {BATCH_MAX_REQUESTS}")
        if len(models) > 1:
            problems.append(f"one model per batch, got {sorted(map(str, models))}")
        now = int(time.time())
        with self._lock:
            outcome = self._batch_outcomes.popleft() if self._batch_outcomes else "completed"
        batch = {
            "id": _new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": file_id, "completion_window": "24h", "status": "in_progress",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": now,
            "expires_at": now + 86_400, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata") or None,
        }
        if problems:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": [
                {"code": "invalid_request", "message": problem, "param": None, "line": None} for problem in problems[:20]]})
            outcome = "failed"
        with self._lock:
            self._batches[batch["id"]] = {"object": batch, "lines": lines, "outcome": outcome, "created": time.monotonic()}
            self._stats.batches_created += 1
        return JSONResponse(batch)

    async def _get_batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        with self._lock:
            entry = self._batches.get(batch_id)
        if entry is None:
            return _error(404, f"No batch found with id '{batch_id}'.", "invalid_request_error")
        # Due by the completion time configured now, so a test can make pending batches finish.
        with self._lock:  # one poller finishes it; the others see it finalizing meanwhile
            due = (entry["object"]["status"] == "in_progress"
                   and time.monotonic() >= entry["created"] + self._settings.batch_completion_s)
            if due:
                entry["object"]["status"] = "finalizing"
                entry["object"]["finalizing_at"] = int(time.time())
        if due:
            await self._finish_batch(entry)
        return JSONResponse(entry["object"])

    async def _cancel_batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        with self._lock:
            entry = self._batches.get(batch_id)
            if entry is None:
                return _error(404, f"No batch found with id '{batch_id}'.", "invalid_request_error")
            if entry["object"]["status"] == "in_progress":
                now = int(time.time())
                entry["object"].update(status="cancelled", cancelling_at=now, cancelled_at=now)
        return JSONResponse(entry["object"])

    async def _finish_batch(self, entry: dict[str, Any]) -> None:
        """Answer every line of a due batch (no latency, no rate limits: the batch pool is its
        own), writing the output and error files, and end it the way its outcome says."""
        batch, outcome, now = entry["object"], entry["outcome"], int(time.time())
        if outcome in ("cancelled", "failed"):
            batch.update(status=outcome, **{f"{outcome}_at": now})
            if outcome == "failed" and not batch["errors"]:
                batch["errors"] = {"object": "list", "data": [{"code": "server_error", "message": "injected batch failure",
                                                               "param": None, "line": None}]}
            return
        endpoint = BATCH_ENDPOINTS[batch["endpoint"]]
        outputs, errors = [], []
        for line in entry["lines"]:
            item = json.loads(line)
            custom_id = item.get("custom_id")
            if outcome == "expired":
                errors.append({"id": _new_id("batch_req_"), "custom_id": custom_id, "response": None,
                               "error": {"code": "batch_expired", "message": "This request could not be executed "
                                         "before the completion window expired."}})
                continue
            with self._lock:
                settings = self._settings
                line_fails = self._rng.random() < settings.p_batch_line_error
            status, response_body = 500, {"error": {"message": "The server had an error while processing your request.",
                                                    "type": "server_error", "param": None, "code": None}}
            if not line_fails:
                status, response_body = await self._batch_line(endpoint, item.get("body") or {}, settings)
            record = {"id": _new_id("batch_req_"), "custom_id": custom_id,
                      "response": {"status_code": status, "request_id": _new_id("req_"), "body": response_body},
                      "error": None}
            (outputs if status == 200 else errors).append(record)
        self._bump(batch_lines=len(entry["lines"]), batch_line_errors=len(errors))
        jsonl = lambda records: "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")  # noqa: E731
        batch["output_file_id"] = self._store_file(jsonl(outputs), "batch_output.jsonl", "batch_output") if outputs else None
        batch["error_file_id"] = self._store_file(jsonl(errors), "batch_errors.jsonl", "batch_output") if errors else None
        batch["request_counts"] = {"total": len(entry["lines"]), "completed": len(outputs), "failed": len(errors)}
        if outcome == "expired":
            batch.update(status="expired", expired_at=now)
        else:
            batch.update(status="completed", finalizing_at=now, completed_at=now)

    async def _batch_line(self, endpoint: str, body: Mapping[str, Any], settings: ProviderSettings) -> tuple[int, dict[str, Any]]:
        """One batch line answered as the synchronous endpoint would: (status, body)."""
        try:
            parsed = parse_request(endpoint, body)
        except BadRequest as exc:
            return 400, {"error": {"message": str(exc), "type": "invalid_request_error", "param": exc.param, "code": None}}
        text = await self._generate_text(parsed, None)
        if isinstance(text, Response):
            return text.status_code, json.loads(bytes(text.body))
        calls: tuple[FunctionCall, ...] = ()
        if isinstance(text, ModelTurn):
            text, calls = text.text, text.function_calls
        generated = "\n".join([text] * bool(text) + [f"{c.name}({c.arguments_json()})" for c in calls])
        usage = self._account(parsed, generated, settings)
        build = _responses_body if endpoint == "responses" else _chat_body
        return 200, build(parsed, text, *usage, calls=calls)

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        return _error(status, f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}",
                      "invalid_request_error")


# --------------------------------------------------------------------------- wire bodies


def _responses_body(parsed: ParsedRequest, text: str, input_tokens: int, output_tokens: int,
                    cached_tokens: int, calls: tuple[FunctionCall, ...] = ()) -> dict[str, Any]:
    """A completed Responses API object: one assistant message (unless the turn is only
    function calls), then one ``function_call`` item per call."""
    body, now = parsed.body, int(time.time())
    output: list[dict[str, Any]] = []
    if text or not calls:
        output.append({
            "id": _new_id("msg_"),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        })
    output.extend({"id": _new_id("fc_"), "type": "function_call", "status": "completed", "call_id": call.call_id,
                   "name": call.name, "arguments": call.arguments_json()} for call in calls)
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": now,
        "completed_at": now,
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": parsed.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": copy.deepcopy(body.get("text")) or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation", "disabled"),
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def _chat_body(parsed: ParsedRequest, text: str, input_tokens: int, output_tokens: int,
               cached_tokens: int, calls: tuple[FunctionCall, ...] = ()) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice (with ``tool_calls`` when the turn calls functions)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [{"id": call.call_id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments_json()}} for call in calls]
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "tool_calls" if calls else "stop",
        }],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_tkg_testing",
    }


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    """``python -m fakes.openai_server``: serve with the default responder until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on start)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--max-in-flight", type=int, default=32, help="concurrent requests before 429 (0: unlimited)")
    parser.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds on 429")
    parser.add_argument("--p-429", type=float, default=0.0, help="probability of an injected 429")
    parser.add_argument("--p-500", type=float, default=0.0, help="probability of an injected 500")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=PROVIDER_MODES, default="slots",
                        help="slots: fixed latency and a concurrency limit; realistic: time to first token + "
                             "tokens/s, RPM/TPM budgets with x-ratelimit-* headers")
    parser.add_argument("--ttft", type=float, default=REALISTIC_TTFT_S, help="realistic: seconds to the first token")
    parser.add_argument("--tokens-per-s", type=float, default=REALISTIC_OUTPUT_TOKENS_PER_S,
                        help="realistic: output tokens per second")
    parser.add_argument("--rpm", type=int, default=REALISTIC_RPM, help="realistic: requests per minute per model (0: none)")
    parser.add_argument("--tpm", type=int, default=REALISTIC_TPM, help="realistic: tokens per minute per model (0: none)")
    parser.add_argument("--batch-completion", type=float, default=0.5, help="seconds a batch stays in progress")
    parser.add_argument("--no-prompt-caching", action="store_true")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--responder", default=None,
                        help="module:callable making the responder, e.g. fakes.responders:PipelineResponder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    responder = None
    if args.responder:
        import importlib

        module, _, attribute = args.responder.partition(":")
        responder = getattr(importlib.import_module(module), attribute)()
    provider = ProviderSettings(
        latency_s=args.latency, max_in_flight=args.max_in_flight or None, retry_after_s=args.retry_after,
        p_429=args.p_429, p_500=args.p_500, prompt_caching=not args.no_prompt_caching, mode=args.mode,
        ttft_s=args.ttft, output_tokens_per_s=args.tokens_per_s, batch_completion_s=args.batch_completion,
        rpm=(args.rpm or None) if args.mode == "realistic" else None,
        tpm=(args.tpm or None) if args.mode == "realistic" else None,
    )
    OpenAICompatibleServer(responder, host=args.host, port=args.port, seed=args.seed, log_level=args.log_level,
                           provider=provider).serve_forever()


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy: responders loaded with
    # --responder import fakes.openai_server, and its classes (FunctionCall, ModelTurn)
    # must be the ones the server checks against.
    from fakes.openai_server import main as _main

    _main()
