"""Mirrors of the namespace objects the API server's admission applies to every pod, so a
round never plans what would be refused: ResourceQuotas, LimitRanges, and the pod slots and
extended resources quotas and nodes count. Pure; imports `objects/` and below. A new
namespace-level limit goes here.

    quotas.py             a namespace's ResourceQuotas as the budget of its policies' rounds
    limitranges.py        a namespace's LimitRanges: the requests its pods will really have
    counted_resources.py  pod slots and extended resources, counted per pod and node
"""
