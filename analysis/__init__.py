"""Structured-log analysis: one analyzer turns any event log (simulated or real) into metrics.json,
plots and a report (docs/analysis.md).
"""
