"""Scripted structured outputs for the local OpenAI-compatible server.

`PipelineResponder` answers tkg's five request kinds (statements, validity ranges, triplets,
figures, judge) with realistic, deterministic content, by reading the rendered prompt the way
a model would: the excerpt, the numbered statements, the candidates. It produces what the
offline rules would, so a test can compare the HTTP path with the offline path item for
item. It stands in for the *model*, never for tkg's client, parsing, caching or batching.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from datetime import date, datetime, timezone

from fakes.openai_server import ParsedRequest
from tkg.core.embeddings import WordLlamaEmbedder
from tkg.core.models import Chunk, RawStatement
from tkg.extract.base import DocumentContext
from tkg.extract.offline import OfflineExtractor
from tkg.invalidate.judges import EventView, RuleJudge, TripletView

_STATEMENT_LINE = re.compile(r'^- \[(\d+)\] "(.*)"(?: \((\w+), (\w+)\))?$', re.MULTILINE)


def _field(text: str, label: str) -> str | None:
    match = re.search(rf"^- {re.escape(label)}: (.*)$", text, re.MULTILINE)
    return match[1].strip() if match else None


def _context(text: str) -> DocumentContext:
    """Rebuild the document context the prompt carries."""
    entity = _field(text, "main entity") or (re.search(r"^Main entity: (.*)$", text, re.MULTILINE) or [None, "Unknown (X)"])[1]
    name, ticker = re.match(r"^(.*) \((\w+)\)$", entity).groups()
    published = _field(text, "publication date (the call)") or _field(text, "publication date (now)") or "2020-01-01"
    quarter_line = _field(text, "fiscal quarter") or _field(text, "fiscal quarter of the call") or "unknown"
    quarter = re.match(r"(Q[1-4] \d{4})", quarter_line)
    period = re.search(r"the period (\d{4}-\d{2}-\d{2}) to (\d{4}-\d{2}-\d{2})", quarter_line)
    year_end = re.search(r"ends in month (\d+)", quarter_line)
    return DocumentContext(
        ticker=ticker, main_entity=name, short_name=name.split()[0].rstrip(","), document_type="Earnings Call Transcript",
        publication_date=datetime.fromisoformat(published.replace("Z", "+00:00")).replace(tzinfo=timezone.utc)
        if "T" not in published else datetime.fromisoformat(published).astimezone(timezone.utc),
        fiscal_quarter=quarter[1] if quarter else None,
        fiscal_period_start=date.fromisoformat(period[1]) if period else None,
        fiscal_period_end=date.fromisoformat(period[2]) if period else None,
        fiscal_year_end_month=int(year_end[1]) if year_end else 12,
    )


class PipelineResponder:
    """Answers by schema name; counts what it answered. Thread-safe."""

    def __init__(self) -> None:
        self.rules = OfflineExtractor()
        self.judge = RuleJudge()
        self.embedder = WordLlamaEmbedder()
        self.answered: Counter = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: ParsedRequest) -> dict:
        handler = {"StatementsOut": self.statements, "ValidityOut": self.validity, "TripletsOut": self.triplets,
                   "FiguresOut": self.figures, "JudgeOut": self.verdicts}.get(request.schema_name or "")
        if handler is None:
            raise ValueError(f"no scripted answer for schema {request.schema_name!r}")
        with self._lock:
            self.answered[request.schema_name] += 1
        return handler(request.input_text)

    def embed(self, texts: list[str], dimensions: int):
        """Real (local) embeddings when the size matches wordllama's, so cosines mean something."""
        if dimensions != self.embedder.dimension:
            return None
        return self.embedder.embed(texts)

    def statements(self, text: str) -> dict:
        context = _context(text)
        excerpt = text.rsplit('"""', 2)[-2].strip("\n")
        speaker = _field(text, "speaker") or ""
        kind = "participants" if "Corporate Participants" in excerpt else "speech"
        chunk = Chunk(chunk_id="c", transcript_id="t", company=context.ticker, chunk_index=0, kind=kind, section="s",
                      speaker=None if speaker.startswith("not a speaker") else re.sub(r" \(.*\)$", "", speaker),
                      start=0, end=len(excerpt), text=excerpt)
        statements = self.rules.extract_statements([chunk], context)[0]
        return {"statements": [s.model_dump(mode="json") for s in statements]}

    def _numbered(self, text: str) -> list[tuple[int, RawStatement]]:
        items = []
        for match in _STATEMENT_LINE.finditer(text):
            items.append((int(match[1]), RawStatement(statement=match[2].replace('\\"', '"'),
                                                      statement_type=match[3] or "FACT", temporal_type=match[4] or "DYNAMIC")))
        return items

    def validity(self, text: str) -> dict:
        context = _context(text)
        numbered = self._numbered(text)
        ranges = self.rules.extract_validity([s for _, s in numbered], context)
        iso = lambda value: value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
        return {"items": [{"index": index, "valid_at": iso(r.valid_at) if r else None, "invalid_at": iso(r.invalid_at) if r else None}
                          for (index, _), r in zip(numbered, ranges)]}

    def triplets(self, text: str) -> dict:
        context = _context(text)
        numbered = self._numbered(text)
        extractions = self.rules.extract_triplets([s for _, s in numbered], context)
        return {"items": [{"index": index, **extraction.model_dump(mode="json")} for (index, _), extraction in zip(numbered, extractions)]}

    def figures(self, text: str) -> dict:
        context = _context(text)
        numbered = self._numbered(text)
        found = self.rules.extract_figures([s for _, s in numbered], context)
        return {"items": [{"index": index, "figures": [f.model_dump(mode="json") for f in figures]}
                          for (index, _), figures in zip(numbered, found)]}

    def verdicts(self, text: str) -> dict:
        primary_text, _, candidates_text = text.partition("Candidates:")
        primary = self._event(primary_text)
        verdicts = []
        for block in re.split(r"^- candidate ", candidates_text, flags=re.MULTILINE)[1:]:
            index = int(block.split(":", 1)[0])
            verdict = self.judge._verdict(primary, self._event(block))
            verdicts.append({"candidate_index": index, "reason": verdict.reason, "invalidates": verdict.invalidates})
        return {"verdicts": verdicts}

    @staticmethod
    def _event(block: str) -> EventView:
        valid = re.search(r"valid_at: ([^;\n]+)", block)
        valid_at = datetime.fromisoformat(valid[1].strip()) if valid and valid[1].strip() != "None" else None
        triplets = []
        for subject, predicate, obj, value in re.findall(r"^\s*\* (.+?) -\[(\w+)\]-> (.+?)(?: \(value: (.*)\))?$", block, re.MULTILINE):
            # canonical names are unique in these prompts, so they can stand in for ids
            triplets.append(TripletView(subject=subject, subject_id=subject, predicate=predicate, object=obj, object_id=obj,
                                        value=value or None))
        return EventView(event_id="x", statement="", statement_type="FACT", temporal_type="DYNAMIC", valid_at=valid_at,
                         invalid_at=None, created_at=valid_at or datetime.now(timezone.utc), triplets=tuple(triplets))
