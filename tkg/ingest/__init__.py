"""Ingestion: transcript sources (the bundled sample, parquet/jsonl/csv files, Hugging Face),
parsing of the StreetEvents text, and semantic chunking; the transcripts and chunks stages."""
