"""The trace-driven cluster simulator: training environment, `simulate` command and benchmarks."""
