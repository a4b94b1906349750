"""Chapter 06 without a model: a request trace through a real scheduler and KV policy, step by step.

The engine's loop (paged_engine.py) with the forward pass replaced by "every scheduled sequence gets
one more token": the scheduler, the policy and the swap space are the very objects the engine uses,
so admission, preemption and swapping happen exactly as they would on the model, in milliseconds.
A step here is one forward pass there; how long a forward pass takes is what this cannot tell (the
benchmark, ``python -m minipaged bench serving``, measures it on the real model).

    from minipaged.simulator.serving import simulate_serving
    run = simulate_serving("continuous", make_policy("on_demand", num_slots=4096), requests)
    run.steps, run.batch_sizes, run.kv_held, run.preemptions

Requests that carry their ``prompt_ids`` are admitted with them, so a prefix cache (chapter 07) can
find their blocks; the others have prompts of one repeated token. Every generated token is token 7.

With ``enable_chunked_prefill`` the scheduler is chapter 08's: ``step_tokens`` then never exceeds
the budget, and a prompt chunk that is not the last samples nothing.

Not modelled: time per step (a prefill step costs more than a decode step on a real model; chapter
08's simulator, simulator/chunked.py, counts a step's cost in the tokens it computes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from minipaged.kv.swap import SwapSpace
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import make_scheduler
from minipaged.sequence import Sequence


class _NoText:
    """A tokenizer stand-in: the simulated tokens have no text."""

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


@dataclass
class ServingRun:
    scheduler: str
    policy: str
    steps: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # sequences in each step's forward pass
    kv_held: list[float] = field(default_factory=list)  # fraction of the pool's slots held, each step
    prefill_tokens: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # tokens computed in each step (prefill + decodes)
    decodes: list[int] = field(default_factory=list)  # sequences decoding one token in each step
    tokens_computed: int = 0  # token positions the steps computed (prompts, minus cache hits, and decodes)
    finish_step: dict[int, int] = field(default_factory=dict)  # request id -> step it finished in
    first_token_step: dict[int, int] = field(default_factory=dict)
    refused: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0

    @property
    def preemptions(self) -> int:
        return self.stats.get("preemptions", 0)


def simulate_serving(scheduler: str, policy, requests, *, max_num_seqs: int = 256,
                     max_num_batched_tokens: int | None = None, preemption_mode: str = "recompute",
                     swap_blocks: int = 0, n: int = 1, max_steps: int = 1_000_000,
                     enable_chunked_prefill: bool = False) -> ServingRun:
    """Run ``requests`` (simulator.workloads.Request, all arriving at once) to the end.

    Each request generates exactly its ``output_len`` tokens (as ``ignore_eos`` does); ``n`` > 1
    forks that many samples per request (the policy must share blocks). Checks the policy's
    invariants after every step and that nothing is left allocated at the end.
    """
    swap = SwapSpace(swap_blocks, policy.block_size) if swap_blocks else None
    run = ServingRun(scheduler, policy.label)
    sched = make_scheduler(scheduler, policy, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                           preemption_mode=preemption_mode, swap_space=swap, stats=run.stats,
                           enable_chunked_prefill=enable_chunked_prefill)
    ids, owner, tokenizer = itertools.count(), {}, _NoText()
    for r in requests:
        params = SamplingParams(n=n, max_tokens=r.output_len, ignore_eos=True)
        prompt = list(r.prompt_ids) if r.prompt_ids is not None else [1] * r.prompt_len
        seqs = [Sequence(next(ids), prompt, params, eos_token_id=-1, max_model_len=policy.max_model_len,
                         index=i) for i in range(n)]
        for s in seqs:
            owner[s.seq_id] = r.request_id
        if n > 1 and policy.shares_blocks:
            sched.add(seqs[0], seqs[1:])
        else:
            for s in seqs:
                sched.add(s)
    while sched.has_work():
        if run.steps >= max_steps:
            raise RuntimeError(f"no end after {max_steps} steps")
        plan = sched.schedule()
        run.refused += [owner[s.seq_id] for s in plan.refused]
        if not plan.work:
            if plan.refused:
                continue
            raise RuntimeError("the scheduler planned nothing and refused nothing: it is stuck")
        policy.drain_copies()  # nothing to copy without K/V
        run.steps += 1
        run.batch_sizes.append(len(plan.work))
        run.prefill_tokens.append(plan.num_prefill_tokens)
        run.step_tokens.append(plan.num_tokens)
        run.decodes.append(plan.num_decodes)
        run.tokens_computed += plan.num_tokens
        usage = policy.usage()
        run.kv_held.append(usage.occupied / usage.total)
        for work in plan.work:
            policy.commit_tokens(work.seq.seq_id, work.tokens)  # their "K/V" is written
            if not work.completes:  # a prompt chunk with more to come (chapter 08)
                continue
            for seq in [*sched.fork_children(work.seq), work.seq]:
                seq.append(7, tokenizer)
                request = owner[seq.seq_id]
                run.first_token_step.setdefault(request, run.steps)
                if seq.finished:
                    sched.finish(seq)
                    run.finish_step[request] = run.steps
        policy.check_invariants()
    assert not policy.seq_ids(), f"blocks leaked: {policy.seq_ids()}"
    if swap is not None:
        swap.check_invariants()
        assert not swap.seq_ids(), "swap space leaked"
    return run
