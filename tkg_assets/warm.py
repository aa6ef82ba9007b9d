"""What the forkserver of tkg's code server loads once, so that every run forked from it starts
with it loaded (tkg_assets.warm_runs): Dagster and tkg's code location, chonkie (the chunker),
and the local embedding model when the settings use it. Nothing here starts a client or a
request. A failure leaves the runs to import what they need themselves (the run that meets
the error reports it in its own log); a warning on the code server's output says so.

Each run forked from it dies with it (tkg_assets/warm_runs.py says why)."""

from __future__ import annotations

import logging
import os
from multiprocessing import util

from tkg.build.runner import die_with_parent


class _Forked:
    """The object multiprocessing's after-fork hook is registered on (it keeps it alive)."""


_FORKED = _Forked()
util.register_after_fork(_FORKED, lambda _: die_with_parent(os.getppid()))

try:
    import chonkie  # noqa: F401  (imported by the chunking stage, which every new call runs)

    import tkg_assets.definitions  # noqa: F401
    from tkg.core.embeddings import WordLlamaEmbedder
    from tkg.settings import Settings

    if Settings.resolve().embeddings == "wordllama":
        WordLlamaEmbedder().load()
except Exception:  # reported by the run that meets it (see the docstring)
    logging.getLogger(__name__).warning("runs will load tkg's code themselves: the warm start failed", exc_info=True)
