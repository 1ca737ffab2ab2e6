"""Analyses of finished runs: metrics, summaries, diagnosis, comparison, explain, notes."""
