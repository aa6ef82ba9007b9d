"""Sentence embeddings behind one small interface.

`WordLlamaEmbedder` is the offline default: its 256-d weights ship inside the wordllama wheel,
so it is loaded from the installed package with downloads disabled and never touches the
network. The OpenAI embedder (same interface) lives in `tkg.llm`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension. `counters` names the
    usage counters it keeps (tkg.core.results.Counted): none for a local model."""

    name: str
    dimension: int
    counters: tuple[str, ...]

    def embed(self, texts: list[str]) -> np.ndarray: ...


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Scale each row to unit length so dot products are cosines; a zero or non-finite row
    becomes zero (a cosine of 0 with everything)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=np.isfinite(norms) & (norms > 0))


def embedding_matrix(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a list<float> column that carry an embedding, as a float32 matrix, and a
    mask of those rows: the ones of the longest length (null or shorter rows are absent)."""
    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    width = int(lengths.max()) if len(lengths) else 0
    present = (lengths == width) & (width > 0)
    if not present.any():
        return np.zeros((0, width), dtype=np.float32), present
    if not present.all():
        lists = lists.filter(pa.array(present))
    matrix = np.asarray(lists.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, width)
    return matrix, present


@lru_cache(maxsize=2)
def _load_wordllama(dimension: int) -> Any:
    import logging

    # wordllama calls logging.basicConfig(level=INFO) on import, which would turn on INFO
    # logging (every HTTP request of the LLM path) for the whole process: undo that.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    import wordllama
    from wordllama import WordLlama

    root.setLevel(level)
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)

    package_dir = Path(wordllama.__file__).parent
    # cache_dir must be the package folder and downloads disabled, or wordllama goes online.
    return WordLlama.load(cache_dir=package_dir, disable_download=True, dim=dimension)


def wordllama_name(dimension: int = 256) -> str:
    return f"wordllama-l2_supercat-{dimension}"


class WordLlamaEmbedder:
    """Offline static embeddings (wordllama l2_supercat, 256 dimensions)."""

    counters: tuple[str, ...] = ()  # a local model: nothing to pay for or count

    def __init__(self, dimension: int = 256) -> None:
        self.dimension = dimension
        self.name = wordllama_name(dimension)

    def load(self) -> None:
        """Load the model now (it loads at the first `embed` otherwise)."""
        _load_wordllama(self.dimension)

    def embed(self, texts: list[str]) -> np.ndarray:
        """The same vectors as `WordLlama.embed` (checked bit for bit in the tests), computed
        faster: texts are batched by length, so batches carry little padding, and tokenized
        without character offsets, which wordllama never reads."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = _load_wordllama(self.dimension)
        table = model.embedding
        pooled = np.empty((len(texts), table.shape[1]), dtype=np.float32)
        order = np.argsort(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), kind="stable")
        for start in range(0, len(texts), _BATCH):
            batch = order[start:start + _BATCH]
            encoded = model.tokenizer.encode_batch_fast([texts[i] for i in batch], add_special_tokens=False)
            ids = np.array([e.ids for e in encoded], dtype=np.int32)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
            np.clip(ids, 0, table.shape[0] - 1, out=ids)
            pooled[batch] = model.avg_pool(table[ids], mask)
        return normalise_rows(pooled)


_BATCH = 64  # wordllama's own batch size
