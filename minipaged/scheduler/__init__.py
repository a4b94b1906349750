"""Schedulers (chapter 06): who runs at each step, who waits, and who is preempted when memory runs out.

    make_scheduler("static", policy, ...)       static.py      a batch runs until its longest request ends
    make_scheduler("continuous", policy, ...)   continuous.py  requests join and leave at every step
    make_scheduler("continuous", policy, enable_chunked_prefill=True, ...)
                                                chunked.py     (chapter 08) long prompts a chunk per step,
                                                               beside the decodes, within a token budget
    make_scheduler("continuous", policy, speculative_config=SpeculativeConfig(...), ...)
                                                speculative.py (chapter 09) drafts of guessed tokens for the
                                                               decoding sequences, checked by the engine

All four own the requests (one ``Request`` each, minipaged/request.py) and are the only callers of the
KV policy's mutating methods. Each engine step they are called twice: ``schedule() -> StepPlan``
(minipaged/step.py: who runs, their slots, the block copies to make) and, once the runner has executed
the plan and sampled, ``update_from_output(plan, output, now)`` with the tokens it returned (tokens
appended, stops, accepted guesses kept, beams ranked, blocks freed). All four preempt by recompute or
by swap (kv/swap.py). Like the KV policies, the schedulers are plain Python: they can be tested
without a model.
"""

from minipaged.config import DEFAULT_CHUNKED_BUDGET, PREEMPTION_MODES, SCHEDULERS
from minipaged.request import Request, RequestStatus
from minipaged.scheduler.chunked import ChunkedPrefillScheduler
from minipaged.scheduler.continuous import ContinuousScheduler
from minipaged.scheduler.speculative import SpeculativeScheduler
from minipaged.scheduler.static import StaticScheduler
from minipaged.step import ScheduledSeq, StepPlan, StepResult


def make_scheduler(name: str, policy, enable_chunked_prefill: bool = False, speculative_config=None, **options):
    """The scheduler of a configuration. The engine core builds it from a validated EngineArgs
    (config.py checks how the options combine); a caller that builds one by hand gets the name
    checked here and each scheduler's own checks."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is not known; choose one of {list(SCHEDULERS)}")
    if speculative_config is not None:
        return SpeculativeScheduler(policy, speculative_config=speculative_config, **options)
    if enable_chunked_prefill:
        return ChunkedPrefillScheduler(policy, **options)
    return (ContinuousScheduler if name == "continuous" else StaticScheduler)(policy, **options)


__all__ = ["SCHEDULERS", "PREEMPTION_MODES", "DEFAULT_CHUNKED_BUDGET", "make_scheduler", "ContinuousScheduler",
           "StaticScheduler", "ChunkedPrefillScheduler", "SpeculativeScheduler", "Request", "RequestStatus",
           "ScheduledSeq", "StepPlan", "StepResult"]
