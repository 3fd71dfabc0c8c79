"""Retraining learned policies from what the cluster recorded (issue 17; docs/retraining.md)."""
