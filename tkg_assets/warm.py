"""What the forkserver of tkg's code server loads once, so that every run forked from it starts
with it loaded (tkg_assets.warm_runs): Dagster and tkg's code location, chonkie (the chunker),
and the local embedding model when the settings use it. Nothing here starts a thread, a client
or a request. A failure is left to the run: it then imports what it needs itself and reports
the error in its own log, as it would without the forkserver."""

from __future__ import annotations

import logging

try:
    import chonkie  # noqa: F401  (imported by the chunking stage, which every new call runs)

    import tkg_assets.definitions  # noqa: F401
    from tkg.core.embeddings import WordLlamaEmbedder
    from tkg.settings import Settings

    if Settings.resolve().embeddings == "wordllama":
        WordLlamaEmbedder().load()
except Exception:  # reported by the run that meets it (see the docstring)
    logging.getLogger(__name__).debug("warm start incomplete", exc_info=True)
