"""Evaluation: metrics, summaries, tables and plots."""
