"""Dagster's run queue, with the backfill daemon's pace as a setting.

Dagster's backfill daemon looks for new backfills, and settles finished ones, every 30 s: a
constant of Dagster's (`dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`, not a
setting; dagster#11649). A backfill launched from the UI therefore waits up to 30 s before its
first run is even planned, 15 s on average, which on a corpus that `tkg build` loads in about a
minute is a quarter of the whole. Each look is two small queries of the run storage.

tkg's instance configuration (tkg/config/dagster.yaml) uses this run coordinator: Dagster's
`QueuedRunCoordinator` with one more field, `backfill_daemon_interval_seconds`. The daemon
process reads the run coordinator before it starts its daemons (to know whether it needs the
queue's), so setting the interval here reaches the backfill daemon's loop. Without the field,
Dagster's 30 s stands. The constant is private: tkg pins its Dagster release, and
tests/test_backfill.py fails if a release moves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster._daemon.controller as daemon_controller
from dagster import Field, IntSource
from dagster._core.run_coordinator import QueuedRunCoordinator

BACKFILL_INTERVAL_FIELD = "backfill_daemon_interval_seconds"


class TkgRunCoordinator(QueuedRunCoordinator):
    """`QueuedRunCoordinator`, plus `backfill_daemon_interval_seconds` (see the module docstring)."""

    def __init__(self, backfill_daemon_interval_seconds: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if backfill_daemon_interval_seconds is not None:
            if backfill_daemon_interval_seconds < 1:
                raise ValueError(f"{BACKFILL_INTERVAL_FIELD} must be at least 1 second, got {backfill_daemon_interval_seconds}")
            if not isinstance(getattr(daemon_controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", None), int):
                raise RuntimeError(f"this Dagster release has no DEFAULT_DAEMON_INTERVAL_SECONDS for {BACKFILL_INTERVAL_FIELD} "
                                   "to set; remove the field from dagster.yaml")
            daemon_controller.DEFAULT_DAEMON_INTERVAL_SECONDS = backfill_daemon_interval_seconds

    @classmethod
    def config_type(cls) -> dict:
        return {**QueuedRunCoordinator.config_type(), BACKFILL_INTERVAL_FIELD: Field(
            config=IntSource, is_required=False,
            description="How often the backfill daemon looks for new backfills and settles running ones "
                        "(Dagster's default: 30 s).")}

    @classmethod
    def from_config_value(cls, inst_data, config_value: Mapping[str, Any]) -> TkgRunCoordinator:
        # the parent's fields are its __init__'s parameters, by name
        return cls(inst_data=inst_data, **{name: config_value.get(name) for name in cls.config_type()})
