"""Measured kernel profiles: the normalised schema, ingestion of public sources, and profiling."""
