"""Chapter 06 without a model: a request trace through the real engine core, step by step.

The engine core (core.py) with a synthetic runner (runner.py): every planned sequence "computes" for
free and gets token 7 as its next token. The scheduler, the KV policy, the swap space and the loop
that admits, preempts and finishes are the very ones that serve the model, so admission, preemption
and swapping happen exactly as they would there, in milliseconds. A step here is one forward pass
there; how long a forward pass takes is what this cannot tell (the benchmark, ``python -m minipaged
bench serving``, measures it on the real model).

    from minipaged.lab.simulator.serving import simulate_serving
    run = simulate_serving("continuous", make_policy("on_demand", num_slots=4096), requests)
    run.steps, run.batch_sizes, run.kv_held, run.preemptions

Requests that carry their ``prompt_ids`` are admitted with them, so a prefix cache (chapter 07) can
find their blocks; the others have prompts of one repeated token.

With ``enable_chunked_prefill`` the scheduler is chapter 08's: ``step_tokens`` then never exceeds
the budget, and a prompt chunk that is not the last samples nothing.

Not modelled: time per step (a prefill step costs more than a decode step on a real model; chapter
08's simulator, simulator/chunked.py, counts a step's cost in the tokens it computes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.config import EngineArgs
from minipaged.core import EngineCore
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import RequestStatus


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


def text_table(header: str, rows: list[str], *notes: str) -> str:
    """A table as the simulator prints it: the header, a rule as wide, a line per row, then the notes."""
    return "\n".join([header, "-" * len(header), *rows, *notes])


CHECK_BLOCKS = 1024  # pools up to this many blocks are checked after every step


def simulate_serving(scheduler: str, policy, requests, *, max_num_seqs: int = 256,
                     max_num_batched_tokens: int | None = None, preemption_mode: str = "recompute",
                     swap_blocks: int = 0, n: int = 1, max_steps: int = 1_000_000,
                     enable_chunked_prefill: bool = False) -> ServingRun:
    """Run ``requests`` (simulator.workloads.Request, all arriving at once) to the end.

    Each request generates exactly its ``output_len`` tokens (as ``ignore_eos`` does); ``n`` > 1
    samples per request are forked from the first when the policy shares blocks. Checks the
    policy's invariants as it goes and that nothing is left allocated at the end. A check reads every
    block, so it runs after every step for pools of up to CHECK_BLOCKS blocks and every
    ``num_blocks // CHECK_BLOCKS`` steps above that, so that a roomy pool does not spend nearly all its
    time checking.
    """
    check_every = max(1, policy.num_blocks // CHECK_BLOCKS)
    blocks = {} if policy.name == "contiguous" else {"block_size": policy.block_size}  # the arena's unit: a slot
    args = EngineArgs(model="synthetic", kv_policy=policy.name, **blocks,
                      kv_capacity_tokens=max(policy.num_slots, policy.block_size), scheduler=scheduler,
                      max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                      preemption_mode=preemption_mode, swap_space_tokens=swap_blocks * policy.block_size,
                      enable_chunked_prefill=enable_chunked_prefill).validate()
    core = EngineCore(args, policy, SyntheticRunner(), None, None, policy.max_model_len)
    run = ServingRun(scheduler, policy.label, stats=core.stats)
    for r in requests:
        prompt = list(r.prompt_ids) if r.prompt_ids is not None else [1] * r.prompt_len
        core.add_request(str(r.request_id), prompt, SamplingParams(n=n, max_tokens=r.output_len, ignore_eos=True))
    with core.metrics.steps.recording() as steps:
        while core.has_unfinished_requests():
            if run.steps >= max_steps:
                raise RuntimeError(f"no end after {max_steps} steps")
            before = len(steps.records)
            changed = core.step()
            if len(steps.records) > before:
                run.steps += 1
                record = steps.records[-1]
                run.batch_sizes.append(record["batch_size"])
                run.prefill_tokens.append(record["num_prefill_tokens"])
                run.step_tokens.append(record["num_tokens"])
                run.decodes.append(record["num_decodes"])
                run.tokens_computed += record["num_tokens"]
                run.kv_held.append(record["kv_occupied"])
            for request_id in changed:
                request, rid = core.requests[request_id], int(request_id)
                if request.status is RequestStatus.REFUSED:  # each sample it could not serve
                    run.refused += [rid] * sum(s.finish_reason == "abort" for s in request.samples)
                elif any(s.output_ids for s in request.samples):
                    run.first_token_step.setdefault(rid, run.steps)
                if request.finished:
                    if rid not in run.refused:
                        run.finish_step[rid] = run.steps
                    core.pop_finished(request_id)
            if run.steps % check_every == 0:
                policy.check_invariants()
    policy.check_invariants()
    assert not policy.seq_ids(), f"blocks leaked: {policy.seq_ids()}"
    if core.swap_space is not None:
        core.swap_space.check_invariants()
        assert not core.swap_space.seq_ids(), "swap space leaked"
    return run
