"""Batch mode: a stage's structured requests go out as OpenAI Batch API jobs, at half price.

A backfill can wait for its answers, and the Batch API bills half for answers within 24 hours.
In batch mode (`TKG_LLM_MODE=batch`, `tkg build --llm-mode batch`, or the `llm_mode` field of
the extraction resource in Dagster's launchpad) `LLMClient._complete` hands each request here
instead of sending it:

- requests gather while a stage's partitions ask for them; after a short quiet spell they go
  out as JSONL files (`/v1/files`, purpose "batch"), one batch per model, split to stay within
  OpenAI's documented 50,000 requests and 200 MB per batch (`/v1/batches`);
- each line's `custom_id` is the sha256 of its request body, and the batch id and its custom
  ids are written to `<home>/cache/llm_batches.sqlite` before anything waits: a killed or
  restarted build asks for the same requests, finds them there, and waits on the same batch
  instead of submitting (and paying for) them again;
- the runner polls with progress in the log (the CLI's and Dagster's run logs), downloads the
  output file, keeps each answer in that state file until it is handed out, and the caller
  parses and caches it exactly as a synchronous answer, in the same statement-hash cache;
- lines in the error file are submitted again, up to `LINE_ATTEMPTS` times; a batch the
  provider expires or cancels is submitted again once (what it finished is kept), and a
  second time fails the stage loudly (`BatchFailed`), so the last good graph stays published;
- costs are counted at the Batch API's price (`LLMSettings.cost_usd(batch=True)`).

Embeddings stay synchronous: they are a small share of the cost and the graph needs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tkg.core.results import StageStats
from tkg.llm.client import LLMClient, RequestFailed

log = logging.getLogger(__name__)

# OpenAI's documented limits of one batch input file.
MAX_REQUESTS_PER_BATCH = 50_000
MAX_BYTES_PER_BATCH = 200 * 1024 * 1024
LINE_ATTEMPTS = 3  # a line the error file lists is submitted again this many times in all
BATCH_RESUBMITS = 1  # an expired or cancelled batch is submitted again once, then the stage fails
TERMINAL = {"completed", "failed", "expired", "cancelled"}


class BatchFailed(RuntimeError):
    """A batch the provider failed, or expired/cancelled twice: the stage cannot finish."""


def custom_id(body: dict[str, Any]) -> str:
    """The id a request goes by in a batch: the hash of its body, so a rerun finds it again."""
    return "tkg-" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:40]


class BatchState:
    """Batches submitted, what each holds, and answers not yet handed out; SQLite, WAL, one
    file per data folder, safe across threads and processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, model TEXT, endpoint TEXT, "
                       "input_file_id TEXT, status TEXT, submitted_at REAL, resubmits INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS batch_items (custom_id TEXT, batch_id TEXT, body TEXT, "
                       "PRIMARY KEY (custom_id, batch_id))")
            db.execute("CREATE TABLE IF NOT EXISTS answers (custom_id TEXT PRIMARY KEY, body TEXT NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA busy_timeout=30000")
            self._local.connection = connection
        return connection

    def answer(self, item: str) -> dict | None:
        row = self._db().execute("SELECT body FROM answers WHERE custom_id = ?", (item,)).fetchone()
        return json.loads(row[0]) if row else None

    def open_batch_of(self, item: str) -> tuple[str, int] | None:
        """(batch id, resubmits) of a batch still running that holds `item`, if any."""
        placeholders = ",".join("?" * len(TERMINAL))
        row = self._db().execute(
            f"SELECT b.batch_id, b.resubmits FROM batch_items i JOIN batches b USING (batch_id) WHERE i.custom_id = ? "
            f"AND b.status NOT IN ({placeholders}) ORDER BY b.submitted_at DESC LIMIT 1", (item, *sorted(TERMINAL))).fetchone()
        return (row[0], row[1]) if row else None

    def record_batch(self, batch_id: str, model: str, endpoint: str, input_file_id: str, status: str, resubmits: int,
                     items: dict[str, dict]) -> None:
        db = self._db()
        db.execute("BEGIN")
        db.execute("INSERT OR REPLACE INTO batches VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (batch_id, model, endpoint, input_file_id, status, time.time(), resubmits))
        db.executemany("INSERT OR REPLACE INTO batch_items VALUES (?, ?, ?)",
                       [(item, batch_id, json.dumps(body)) for item, body in items.items()])
        db.execute("COMMIT")

    def set_status(self, batch_id: str, status: str) -> None:
        self._db().execute("UPDATE batches SET status = ? WHERE batch_id = ?", (status, batch_id))

    def items_of(self, batch_id: str) -> dict[str, dict]:
        rows = self._db().execute("SELECT custom_id, body FROM batch_items WHERE batch_id = ?", (batch_id,)).fetchall()
        return {item: json.loads(body) for item, body in rows}

    def keep_answers(self, answers: dict[str, dict]) -> None:
        db = self._db()
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?)", [(k, json.dumps(v)) for k, v in answers.items()])
        db.execute("COMMIT")

    def batches(self) -> list[tuple[str, str]]:
        """(batch id, status) of every batch recorded, oldest first."""
        return self._db().execute("SELECT batch_id, status FROM batches ORDER BY submitted_at").fetchall()


@dataclass
class _Waiting:
    """A request in batch mode: its body, and whoever waits for its answer."""

    body: dict[str, Any]
    futures: list[asyncio.Future] = field(default_factory=list)
    line_attempts: int = 0


class BatchRunner:
    """Sends the client's structured requests as Batch API jobs (see the module docstring)."""

    def __init__(self, client: LLMClient, state_path: str | Path, poll_s: float | None = None,
                 quiet_s: float = 0.3, max_requests: int = MAX_REQUESTS_PER_BATCH,
                 max_bytes: int = MAX_BYTES_PER_BATCH) -> None:
        self.client = client
        self.state = BatchState(state_path)
        self.poll_s = client.settings.batch_poll_s if poll_s is None else poll_s
        self.quiet_s, self.max_requests, self.max_bytes = quiet_s, max_requests, max_bytes
        self._collecting: dict[str, _Waiting] = {}  # not yet submitted
        self._watched: dict[str, asyncio.Task] = {}  # batch id -> its watcher
        self._attached: dict[str, dict[str, _Waiting]] = {}  # batch id -> what waits on it
        self._flush: asyncio.TimerHandle | None = None
        self.submitted = 0  # batches this runner created (not the ones it resumed)

    @property
    def endpoint(self) -> str:
        return "/v1/chat/completions" if self.client.settings.api_mode == "chat" else "/v1/responses"

    async def complete(self, stage: str, body: dict[str, Any], stats: StageStats) -> str:
        """The answer's text to the request `body`, through a batch; tokens and cost (at the batch
        price) go into `stats`. Raises RequestFailed for a line that kept failing, BatchFailed
        when the batch itself cannot finish."""
        item = custom_id(body)
        answer = self.state.answer(item)
        if answer is None:
            loop = asyncio.get_running_loop()
            future: asyncio.Future = loop.create_future()
            self._wait_for(item, body, future)
            answer = await future
        parse = ChatCompletion if self.client.settings.api_mode == "chat" else Response
        stats.requests += 1
        text, output_tokens = self.client.read_answer(parse.model_validate(answer), body["model"], stats, batch=True)
        self.client._observe_output(stage, output_tokens)
        return text

    def _wait_for(self, item: str, body: dict[str, Any], future: asyncio.Future) -> None:
        for waiting_on in self._attached.values():  # already in a batch this process watches
            if item in waiting_on:
                waiting_on[item].futures.append(future)
                return
        if item in self._collecting:
            self._collecting[item].futures.append(future)
            return
        running = self.state.open_batch_of(item)
        if running is not None:  # submitted before a kill or restart: wait on it, do not pay again
            batch_id, resubmits = running
            if batch_id not in self._watched:
                log.info("batch %s: resuming (submitted by an earlier run)", batch_id)
                self._attached[batch_id] = {known: _Waiting(known_body) for known, known_body in self.state.items_of(batch_id).items()}
                self._watched[batch_id] = asyncio.ensure_future(self._watch(batch_id, resubmits))
            self._attached[batch_id].setdefault(item, _Waiting(body)).futures.append(future)
            return
        self._collecting[item] = _Waiting(body, [future])
        if self._flush is not None:
            self._flush.cancel()
        self._flush = asyncio.get_running_loop().call_later(self.quiet_s, lambda: asyncio.ensure_future(self._submit_collected()))

    async def _submit_collected(self) -> None:
        collected, self._collecting, self._flush = self._collecting, {}, None
        try:
            await self._submit_by_model(collected)
        except Exception as error:  # nobody awaits this task: whatever broke must reach the callers
            self._fail(collected, BatchFailed(f"could not submit a batch: {type(error).__name__}: {error}"))

    async def _submit_by_model(self, collected: dict[str, _Waiting], resubmits: int = 0) -> None:
        by_model: dict[str, dict[str, _Waiting]] = {}
        for item, waiting in collected.items():
            by_model.setdefault(waiting.body["model"], {})[item] = waiting
        for model, items in by_model.items():
            for part in self._split(items):
                await self._submit(model, part, resubmits)

    def _split(self, items: dict[str, _Waiting]) -> list[dict[str, _Waiting]]:
        """Groups within the per-batch request and size limits."""
        parts: list[dict[str, _Waiting]] = [{}]
        size = 0
        for item, waiting in items.items():
            line = len(self._line(item, waiting.body))
            if parts[-1] and (len(parts[-1]) >= self.max_requests or size + line > self.max_bytes):
                parts.append({})
                size = 0
            parts[-1][item] = waiting
            size += line
        return [part for part in parts if part]

    def _line(self, item: str, body: dict[str, Any]) -> bytes:
        return (json.dumps({"custom_id": item, "method": "POST", "url": self.endpoint, "body": body},
                           separators=(",", ":")) + "\n").encode("utf-8")

    async def _submit(self, model: str, items: dict[str, _Waiting], resubmits: int) -> None:
        openai_client, _ = self.client._ensure()
        content = b"".join(self._line(item, waiting.body) for item, waiting in items.items())
        try:
            uploaded = await openai_client.files.create(file=("tkg_batch.jsonl", io.BytesIO(content), "application/jsonl"),
                                                        purpose="batch")
            batch = await openai_client.batches.create(input_file_id=uploaded.id, endpoint=self.endpoint,
                                                       completion_window="24h", metadata={"tkg": "backfill"})
        except openai.APIError as error:
            self._fail(items, BatchFailed(f"could not submit a batch of {len(items)} request(s) for {model}: {error}"))
            return
        # Written before anything waits: a kill from here on resumes this batch.
        self.state.record_batch(batch.id, model, self.endpoint, uploaded.id, batch.status, resubmits,
                                {item: waiting.body for item, waiting in items.items()})
        self.submitted += 1
        log.info("batch %s: submitted %d request(s) for %s (%.1f MB)", batch.id, len(items), model, len(content) / 1e6)
        self._attached[batch.id] = items
        self._watched[batch.id] = asyncio.ensure_future(self._watch(batch.id, resubmits))

    async def _watch(self, batch_id: str, resubmits: int) -> None:
        try:
            await self._follow(batch_id, resubmits)
        except Exception as error:  # nobody awaits this task: whatever broke must reach the callers
            self._watched.pop(batch_id, None)
            self._fail(self._attached.pop(batch_id, {}), BatchFailed(f"batch {batch_id}: {type(error).__name__}: {error}"))

    async def _follow(self, batch_id: str, resubmits: int) -> None:
        openai_client, _ = self.client._ensure()
        started, last = time.monotonic(), None
        try:
            while True:
                batch = await openai_client.batches.retrieve(batch_id)
                counts = batch.request_counts
                progress = (batch.status, counts.completed if counts else 0, counts.failed if counts else 0)
                if progress != last:
                    log.info("batch %s: %s, %d of %d done, %d failed (%.0f s)", batch_id, batch.status, progress[1],
                             counts.total if counts else 0, progress[2], time.monotonic() - started)
                    last = progress
                if batch.status in TERMINAL:
                    break
                await asyncio.sleep(self.poll_s)
        except openai.APIError as error:
            self._fail(self._attached.pop(batch_id, {}), BatchFailed(f"batch {batch_id}: cannot follow it: {error}"))
            self._watched.pop(batch_id, None)
            return
        self.state.set_status(batch_id, batch.status)
        waiting = self._attached.pop(batch_id, {})
        self._watched.pop(batch_id, None)
        if batch.status == "failed":
            reasons = "; ".join(e.message or "" for e in (batch.errors.data if batch.errors and batch.errors.data else []))
            self._fail(waiting, BatchFailed(f"batch {batch_id} failed: {reasons or 'no reason given'}"))
            return
        answered, line_errors = await self._results(batch)
        self.state.keep_answers(answered)  # kept: a kill before the caller caches them loses nothing
        retry: dict[str, _Waiting] = {}
        # Lines of a resumed batch that nobody asks for any more are not paid for again.
        for item, entry in ((k, v) for k, v in waiting.items() if v.futures):
            if item in answered:
                for future in entry.futures:
                    if not future.done():
                        future.set_result(answered[item])
                continue
            if batch.status in ("expired", "cancelled"):
                retry[item] = entry
                continue
            entry.line_attempts += 1
            if entry.line_attempts >= LINE_ATTEMPTS:
                reason = line_errors.get(item, "no answer in the output file")
                self._fail({item: entry}, RequestFailed(f"batch line failed {entry.line_attempts} times: {reason}"))
            else:
                retry[item] = entry
        if not retry:
            return
        if batch.status in ("expired", "cancelled"):
            if resubmits >= BATCH_RESUBMITS:
                self._fail(retry, BatchFailed(f"batch {batch_id} was {batch.status} again after being resubmitted; "
                                              f"{len(retry)} request(s) have no answer. Run the build again later, or "
                                              "without --llm-mode batch"))
                return
            log.warning("batch %s was %s with %d request(s) unanswered; submitting them again once",
                        batch_id, batch.status, len(retry))
            resubmits += 1
        else:
            log.info("batch %s: %d line(s) in the error file; submitting them again", batch_id, len(retry))
        await self._submit_by_model(retry, resubmits)

    async def _results(self, batch: Any) -> tuple[dict[str, dict], dict[str, str]]:
        """Answers of the output file by custom id, and the reason of each line that failed."""
        openai_client, _ = self.client._ensure()
        answered: dict[str, dict] = {}
        errors: dict[str, str] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            content = await openai_client.files.content(file_id)
            for line in content.text.splitlines():
                if not line.strip():
                    continue
                record = json.loads(line)
                response, error = record.get("response") or {}, record.get("error")
                if response.get("status_code") == 200 and isinstance(response.get("body"), dict):
                    answered[record["custom_id"]] = response["body"]
                else:
                    body_error = (response.get("body") or {}).get("error") if isinstance(response.get("body"), dict) else None
                    detail = error or body_error or {}
                    errors[record["custom_id"]] = f"{detail.get('code') or response.get('status_code')}: {detail.get('message', '')}"
        return answered, errors

    @staticmethod
    def _fail(items: dict[str, _Waiting], error: BaseException) -> None:
        for entry in items.values():
            for future in entry.futures:
                if not future.done():
                    future.set_exception(error)
