"""Storage: the Parquet system of record (a folder or an S3 bucket), the published DuckDB file
with its SQL models, and the checks a new file must pass before it replaces the old one."""
