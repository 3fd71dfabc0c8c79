"""The kopf wiring: the top layer, the only one that knows kopf's decorators. Imports any
subpackage below. A new watched kind is one entry of watched.py's WATCHED (its index
function beside it, its record where its constraint lives); a handler of its own in
handlers.py only if a change of it wakes something other than every admission.

    watched.py        the watched kinds (WATCHED) and their kopf indexes; INDEXED and
                      indexes_from derived from the table
    startup.py        kopf settings, startup and cleanup, runtime(), wake_all_admissions
    handlers.py       kopf event handlers: decorators and wiring only
    jobs.py           what the MLJob handlers do, apart from kopf: children, status, the
                      lifecycle sweep and due jobs
    job_lifecycle.py  a job's phase and conditions evaluated and written
    pod_problems.py   why a job's pods do not run: unscheduled, stuck, claims, refused
    pod_events.py     pods pinned when placeable, hand scaling undone, Services restored

The process entry point is `python -m mlsched.controller` (controller/__main__.py).
"""
