"""The trace-driven cluster simulator: training environment, `simulate` command and benchmarks.

Its core: simulator.py (the Simulator, slot by slot), config.py (SimConfig), job_state.py,
pace.py (GPU-type pace, phases, busy time, measurements), ideal.py (ideal times), runner.py
(a whole run under a set of policies), result.py (SimResult); around it the guards and
rollouts (grouping_guard, placement_guard, regret_guard, regret_replay, forecast), the
co-location model and its error, quotas, GPU restrictions, scenarios, comparisons and plots.
"""
