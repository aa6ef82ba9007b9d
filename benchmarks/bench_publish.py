"""Benchmark: a fresh publish of a store, with the raw tables loaded as the publish loads them
now, or all in small pieces as it did before (`--pieces small`: every table LOAD_PIECE_BYTES of
Parquet per statement), side by side in one tree.

    python benchmarks/bench_publish.py --store /work/scale1m/events_1000000 --pieces current
    python benchmarks/bench_publish.py --store /work/scale1m/events_1000000 --pieces small

The store is one `bench_scale.py --keep` left (or any tkg home). The global steps' tables are
published when the store has them, and empty when it does not. The file is written to
`--target` (default: `bench_publish.duckdb` in the store's folder) and removed after. Prints one
JSON line: the publish's seconds, the file's size and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from tkg.build import catalog
from tkg.core.versions import Stamp
from tkg.settings import Settings
from tkg.store import warehouse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a tkg home with a parquet/ tree")
    parser.add_argument("--pieces", choices=("current", "small"), default="current")
    parser.add_argument("--target", type=Path, help="where to write the file (default: beside the store)")
    args = parser.parse_args()
    if args.pieces == "small":
        warehouse.NARROW_PIECE_BYTES = warehouse.LOAD_PIECE_BYTES
    settings = Settings.resolve(home=args.store, backend="offline", embeddings="wordllama")
    target = args.target or args.store / "bench_publish.duckdb"
    target.unlink(missing_ok=True)
    started = time.perf_counter()
    try:
        published = warehouse.publish(settings.store(), target, catalog.raw_tables(), stamp=Stamp("warehouse", "bench", {}, {}),
                                      memory_limit=settings.duckdb_memory, disk_limit=settings.duckdb_disk(target.parent))
        seconds = round(time.perf_counter() - started, 2)
        size_gb = round(target.stat().st_size / 2**30, 2)
    finally:
        target.unlink(missing_ok=True)
    print(json.dumps({"pieces": args.pieces, "seconds": seconds, "file_gb": size_gb,
                      "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                      "raw_rows": published.raw_rows, "parts": published.seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
