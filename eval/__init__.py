"""Evaluation harness: ``eval/score.py`` turns prediction files into metrics (no torch needed)."""
