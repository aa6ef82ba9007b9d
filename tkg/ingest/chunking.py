"""Semantic chunking of a parsed transcript, with character offsets kept for provenance.

The participants list becomes one chunk of its own (the extractor turns it into HOLDS_ROLE
facts). Each speaker turn is chunked on its own with chonkie's SemanticChunker, so a chunk never
mixes two speakers and always knows who said it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tkg.core.embeddings import Embedder
from tkg.core.models import Chunk, Transcript


@dataclass(frozen=True)
class ChunkingSettings:
    threshold: float = 0.6
    min_sentences_per_chunk: int = 3
    chunk_size_words: int = 512
    # Turns shorter than this are one chunk; the chunker would not split them anyway.
    min_chars_to_split: int = 600


@lru_cache(maxsize=1)
def _adapter_class() -> type:
    """A chonkie embeddings class over any tkg `Embedder` (wordllama by default) instead of its
    hub models. chonkie is imported here, not at module load: it takes a second to import, and
    only the chunking stage needs it."""
    from chonkie.embeddings import BaseEmbeddings

    class ChonkieAdapter(BaseEmbeddings):
        def __init__(self, embedder: Embedder) -> None:
            super().__init__()
            self._embedder = embedder

        def embed(self, text: str) -> np.ndarray:
            return self._embedder.embed([text])[0]

        def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
            return list(self._embedder.embed(list(texts))) if texts else []

        @property
        def dimension(self) -> int:
            return self._embedder.dimension

        def get_tokenizer(self) -> str:
            return "word"

    return ChonkieAdapter


def chunk_id_for(transcript_id: str, start: int, end: int) -> str:
    return hashlib.sha256(f"{transcript_id}:{start}:{end}".encode()).hexdigest()[:20]


def chunk_transcript(transcript: Transcript, embedder: Embedder, settings: ChunkingSettings = ChunkingSettings()) -> list[Chunk]:
    """Split a transcript into chunks: one for the participants list, then per-turn semantic chunks."""
    from chonkie import SemanticChunker

    chunker = SemanticChunker(
        embedding_model=_adapter_class()(embedder),
        threshold=settings.threshold,
        min_sentences_per_chunk=settings.min_sentences_per_chunk,
        chunk_size=settings.chunk_size_words,
    )
    chunks: list[Chunk] = []

    def add(kind: str, section: str, start: int, end: int, **speaker: str | None) -> None:
        chunks.append(
            Chunk(chunk_id=chunk_id_for(transcript.transcript_id, start, end), transcript_id=transcript.transcript_id,
                  company=transcript.company, chunk_index=len(chunks), kind=kind, section=section, start=start,
                  end=end, text=transcript.text[start:end], **speaker)
        )

    if transcript.participants_end > transcript.participants_start:
        add("participants", "Participants", transcript.participants_start, transcript.participants_end)
    for turn in transcript.turns:
        speaker = {"speaker": turn.speaker or None, "speaker_organization": turn.organization, "speaker_title": turn.title}
        kind = "speech" if turn.speaker else "summary"
        if len(turn.text) < settings.min_chars_to_split:
            add(kind, turn.section, turn.start, turn.end, **speaker)
            continue
        for piece in chunker.chunk(turn.text):
            start = turn.start + piece.start_index
            # chonkie keeps trailing whitespace with the sentence; trim it so offsets stay tight.
            end = start + len(piece.text.rstrip())
            if end > start:
                add(kind, turn.section, start, end, **speaker)
    return chunks
