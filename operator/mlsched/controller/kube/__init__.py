"""The Kubernetes API seam and everything that writes through it. Lowest layer: imports no
other controller subpackage.

    constants.py       names the operator writes into the cluster: labels, the scheduling
                       gate, annotations, finalizers, the progress audience and paths
    kube.py            `KubeApi`: the one seam to the API server (`ClientKubeApi` in threads;
                       an in-memory fake in tests), its resources and errors
    priority_slots.py  the create slots, served by priority then arrival
    token_bucket.py    the rate limit the writers and the token reviews share
    token_reviews.py   TokenReviews for the progress endpoint, cached and rate-limited
    write_queue.py     the writers' shared background queue: keyed, a few at a time, retried
    status_writer.py   status merge patches written in the background, never dropped
    written_status.py  what this operator last wrote into each job's status, over older watch bodies
    object_writer.py   whole objects (the dataset's ConfigMaps) written in the background
    events.py          Kubernetes Events about MLJobs and SchedulingPolicies
"""
