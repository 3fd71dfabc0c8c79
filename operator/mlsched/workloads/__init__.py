"""Workloads: the model catalog, speed models, interference and job traces."""
