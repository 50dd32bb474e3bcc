"""Data stage: ingest -> validate (Great Expectations) -> preprocess (Spark tokenization)."""
