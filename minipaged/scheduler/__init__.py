"""Schedulers (chapter 06): who runs at each step, who waits, and who is preempted when memory runs out.

    make_scheduler("static", policy, ...)       static.py      a batch runs until its longest request ends
    make_scheduler("continuous", policy, ...)   continuous.py  requests join and leave at every step

Both plan one engine step at a time (``schedule() -> StepPlan``, plan.py) over the same KV policy,
and both preempt by recompute or by swap (kv/swap.py). The engine (paged_engine.py) only executes
the plan: block copies, one forward pass, sampling; then it tells the scheduler what finished.
Like the KV policies, the schedulers are plain Python: they can be tested without a model.
"""

from minipaged.scheduler.continuous import PREEMPTION_MODES, ContinuousScheduler
from minipaged.scheduler.plan import Group, ScheduledSeq, StepPlan
from minipaged.scheduler.static import StaticScheduler

SCHEDULERS = ("continuous", "static")


def make_scheduler(name: str, policy, **options):
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is not known; choose one of {list(SCHEDULERS)}")
    return (ContinuousScheduler if name == "continuous" else StaticScheduler)(policy, **options)


__all__ = ["SCHEDULERS", "PREEMPTION_MODES", "make_scheduler", "ContinuousScheduler", "StaticScheduler",
           "Group", "ScheduledSeq", "StepPlan"]
