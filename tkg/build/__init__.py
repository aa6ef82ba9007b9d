"""Building: the stage catalog, the store's state (what every file was built from), the
planner (what is stale and why), the stage runner, the worker pool, and the global steps.
`tkg build`, the schedule and the Dagster assets all build through here."""
