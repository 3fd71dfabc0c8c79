"""Plain data types shared by the simulator and the operator: nodes, jobs, snapshots, packing."""
