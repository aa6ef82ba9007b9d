"""The Dagster layer of tkg: thin assets over the plain modules in `tkg`."""

import warnings

import dagster as dg

# backfill_policy on @asset is beta and partitioned asset checks are in preview in Dagster 1.13;
# tkg uses both on purpose (see notes in tkg_assets/partitions.py and checks.py).
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

# A step waiting for a pool slot sleeps between looks (Dagster 1.13 spins a core): tkg_assets/pool_wait.py.
from tkg_assets.pool_wait import sleep_between_pool_claims

sleep_between_pool_claims()

# A code server forks each run from a process that has loaded tkg's code: tkg_assets/warm_runs.py.
from tkg_assets.warm_runs import start_runs_warm

start_runs_warm()
