"""tkg: temporal knowledge graphs from earnings-call transcripts.

The pipeline, phase by phase (each subpackage says what it owns):

    ingest -> extract (offline rules or llm) -> resolve -> invalidate -> store (tkg.duckdb) -> answer

`tkg.core` holds what every phase shares; `tkg.build` runs the stages of the stage catalog
(tkg.build.catalog) incrementally; `tkg.settings` and `tkg.providers` say what they run with;
`tkg.cli` is the `tkg` command. None of it imports dagster: the Dagster layer is `tkg_assets`
(with `resources`), a thin shell over this package.
"""
