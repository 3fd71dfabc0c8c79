"""Placement heuristics: which node a task goes to."""
