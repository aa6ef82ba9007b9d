"""A step waiting for a pool slot sleeps between its claims instead of spinning a core.

While a step waits for a slot of its pool (tkg_llm: one per core), Dagster's step executor
sleeps for `InstanceConcurrencyContext.interval_to_next_pending_claim_check()` seconds between
looks. In Dagster 1.13 that method returns `min(0, time to the next claim)`, never more than
0, so the run's process loops without sleeping until the slot frees: a whole core taken from
the runs that hold the slots (found by Dagster too, dagster PR #20367, closed unmerged). Claims
themselves keep Dagster's back-off (1 s, then 10% longer each time, at most 15 s); only the
sleep before the next look is fixed here.

tkg's run queue starts one run more than there are pool slots (tkg/config/dagster.yaml), so
that a backfill's next run has loaded its code when a slot frees; with the spin, that waiting
run cost more than it saved. Every process that loads tkg's code location or instance imports
`tkg_assets`, which applies this. tests/test_backfill.py measures the waiting run's CPU.
"""

from __future__ import annotations

import time

from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext


def _seconds_to_next_claim(self: InstanceConcurrencyContext) -> float:
    """Seconds until the soonest pending claim may be tried again (0 if one may be tried now)."""
    timeouts = self._pending_timeouts.values()
    if not self._pending_claims or not timeouts:
        return 0.0
    return max(0.0, min(timeouts) - time.time())


def sleep_between_pool_claims() -> None:
    """Replace Dagster's interval (see the module docstring); idempotent."""
    if not callable(getattr(InstanceConcurrencyContext, "interval_to_next_pending_claim_check", None)):
        raise RuntimeError("this Dagster release has no interval_to_next_pending_claim_check to fix; "
                           "remove tkg_assets.pool_wait")
    InstanceConcurrencyContext.interval_to_next_pending_claim_check = _seconds_to_next_claim
