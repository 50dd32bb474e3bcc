"""Data stage: ingest -> validate (Great Expectations) -> preprocess (tokenization on the data
stage's engine: ``pipelines.engines``)."""
