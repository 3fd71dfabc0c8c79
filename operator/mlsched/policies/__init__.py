"""Scheduling policies: one Protocol per decision kind, heuristics, learned runners, a registry."""
