"""Evaluation: run phases, the runner connecting adapters and calibrators, metrics, reports."""
