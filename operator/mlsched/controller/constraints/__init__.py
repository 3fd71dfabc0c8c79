"""What a pod template or a node constrains, parsed from the Kubernetes objects. Pure; imports
only `kube/` (constants) and `mlsched.workloads` (the GPU types). A new per-pod or per-node constraint goes here, its record fields in
`objects/records.py`, and its planning in `scheduling/snapshot.py`.

    node_constraints.py   the nodes a template allows: nodeSelector, required node affinity
                          (and the GPU types a job allows a role)
    gpu_labels.py         a node's GPU type, read from its GPU product label
    label_selector.py     metav1.LabelSelector, as anti-affinity and spreading use it
    topology_spread.py    topologySpreadConstraints, enforced by the planner
    pod_anti_affinity.py  required pod anti-affinity per node ("one of these per node")
    host_ports.py         host ports a pod holds on its node
    runtimeclasses.py     RuntimeClasses: the overhead and scheduling a class adds to a pod
    dra.py                Dynamic Resource Allocation: devices claimed, counted per node
"""
