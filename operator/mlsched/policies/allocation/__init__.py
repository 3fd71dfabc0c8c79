"""Allocation heuristics: how many PS and workers each job gets this interval."""
