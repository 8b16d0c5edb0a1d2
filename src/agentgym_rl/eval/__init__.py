"""Evaluation: Avg@n, Pass@k, per category, reports and plots."""
