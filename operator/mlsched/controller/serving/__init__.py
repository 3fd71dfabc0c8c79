"""Which learned models a SchedulingPolicy serves: its spec resolved into policy objects, the
published versions it adopts, and the progress endpoint's TLS. Imports `kube/` and
`mlsched.formats` (the model and version formats retraining shares).

    models.py            a policy's spec → the policy objects a round runs, models loaded
                         (cached by model and card digest), the fallback and its verdicts
    version_adoption.py  which published model version serves (spec.updatePolicy), its status
    serving_tls.py       the progress endpoint's CA and certificate, kept in a Secret
"""
