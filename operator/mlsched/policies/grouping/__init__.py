"""Grouping policies (Harmony co-location): which jobs share which nodes."""
