"""Schedulers (chapter 06): who runs at each step, who waits, and who is preempted when memory runs out.

    make_scheduler("static", policy, ...)       static.py      a batch runs until its longest request ends
    make_scheduler("continuous", policy, ...)   continuous.py  requests join and leave at every step
    make_scheduler("continuous", policy, enable_chunked_prefill=True, ...)
                                                chunked.py     (chapter 08) long prompts a chunk per step,
                                                               beside the decodes, within a token budget
    make_scheduler("continuous", policy, speculative_config=SpeculativeConfig(...), ...)
                                                speculative.py (chapter 09) drafts of guessed tokens for the
                                                               decoding sequences, checked by the engine

Both plan one engine step at a time (``schedule() -> StepPlan``, plan.py) over the same KV policy,
and both preempt by recompute or by swap (kv/swap.py). The engine core (core.py) hands the plan
to a runner (runner.py: block copies, one forward pass), samples, and tells the scheduler what finished.
Like the KV policies, the schedulers are plain Python: they can be tested without a model.
"""

from minipaged.config import DEFAULT_CHUNKED_BUDGET, PREEMPTION_MODES, SCHEDULERS
from minipaged.scheduler.chunked import ChunkedPrefillScheduler
from minipaged.scheduler.continuous import ContinuousScheduler
from minipaged.scheduler.plan import Group, ScheduledSeq, StepPlan
from minipaged.scheduler.speculative import SpeculativeScheduler
from minipaged.scheduler.static import StaticScheduler


def make_scheduler(name: str, policy, enable_chunked_prefill: bool = False, speculative_config=None, **options):
    """The scheduler of a configuration. The options are checked once, by EngineArgs.validate()
    (config.py); only the name is checked here, for callers that build a scheduler by hand."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is not known; choose one of {list(SCHEDULERS)}")
    if speculative_config is not None:
        return SpeculativeScheduler(policy, speculative_config=speculative_config, **options)
    if enable_chunked_prefill:
        return ChunkedPrefillScheduler(policy, **options)
    return (ContinuousScheduler if name == "continuous" else StaticScheduler)(policy, **options)


__all__ = ["SCHEDULERS", "PREEMPTION_MODES", "DEFAULT_CHUNKED_BUDGET", "make_scheduler", "ContinuousScheduler",
           "StaticScheduler", "ChunkedPrefillScheduler", "SpeculativeScheduler", "Group", "ScheduledSeq",
           "StepPlan"]
