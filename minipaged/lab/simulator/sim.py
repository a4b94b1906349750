"""Step-level simulation of a request trace against one KV policy, without any model.

It drives the very policy objects the engine uses (``minipaged.kv``), replacing the forward pass
by "every running request produces one token". Each step:

    1. requests whose arrival step has come join the waiting queue;
    2. admission, first come first served: while the queue head fits (``can_allocate``) it is
       allocated and its prompt written (``append_slots(prompt_len)``). A head that can never fit
       (ValueError) is refused with the reason and dropped; one that does not fit *now* blocks the
       queue until memory frees up (no skipping ahead);
    3. decode: every running request appends one token. If a paged policy has no free block for it,
       the most recently admitted request is preempted (freed, its tokens so far recomputed later as
       its prompt) and put back at the head of the queue, until the token fits;
    4. the step's memory state is recorded (``usage``, with the queue head for external
       fragmentation), then requests that reached their final length are freed.

Measures (``SimulationResult``):
    utilization       time-average of tokens / occupied over the *loaded* steps: those where some
                      request is still waiting at the record point, i.e. memory is what limits the
                      system. Idle ramp-up and the final drain (nothing waiting) are excluded, so
                      policies are compared in the regime the question is about. If no step was
                      loaded, the average is over the busy steps (something allocated) instead, and
                      ``utilization_basis`` says so.
    mean_usage        the five waste terms averaged over the same steps, as fractions of the pool.
    peak_utilization  the highest tokens / occupied of any step.
    max_concurrent    the most requests running in one step.
    refused           requests that can never fit, with the policy's reason.
    fragmentation_blocked_steps  loaded steps where the head could not be admitted although all
                      free memory together would hold it (external fragmentation > 0).
    unused_per_seq    slots a running sequence holds but has no token in (reserved + internal), per
                      running sequence: the mean over every step with at least one running, and the worst step.

Why this loop is not the engine core's (core.py, which the later simulators run with a synthetic
runner): chapters 01-04 compare memory layouts, not schedulers. Here every policy, the reserving
ones included, sees the same trace with arrivals over time, the same one-token steps and the same
crude preemption, so that the only thing that differs between two runs is where the K/V goes; and
each step's snapshot (which request owns which slot) is what the memory-map figures draw.

Not modelled: time per step (a step is one token for everyone), prefill cost, chunked prefill,
sharing, swapping; preemption here is the crudest possible (chapter 06 does it properly).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minipaged.kv import KVPolicy, NoFreeMemory, Usage
from minipaged.lab.simulator.workloads import Request

# What one slot holds in a picture of the pool (plots/memory_map.py colours them): the five parts of the
# waste accounting (kv/base.py's usage).
FREE, TOKEN, RESERVED, INTERNAL, EXTERNAL = 0, 1, 2, 3, 4

USAGE_TERMS = ("tokens", "reserved", "internal", "external", "free")

# Cell states in a memory-map timeline.


@dataclass
class Timeline:
    """Who holds which part of the pool, step by step, for memory-map plots.

    The pool is drawn as ``len(owner[0])`` cells of ``cell_slots`` slots (whole blocks) each; a cell
    shows the state of the slot at its start (exact when a cell is one block or one slot).
    owner[i][c]: request id owning cell c at steps[i], or -1; state[i][c]: FREE, TOKEN, RESERVED,
    INTERNAL or EXTERNAL (free, but unusable by the queue head).
    """

    policy: str
    num_slots: int
    block_size: int
    cell_slots: int
    steps: list[int] = field(default_factory=list)
    owner: list[list[int]] = field(default_factory=list)
    state: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class StepRecord:
    """The memory state at one step's record point, and the queue beside it."""

    step: int
    usage: Usage
    running: int
    waiting: int  # > 0 makes this a loaded step


@dataclass
class SimulationResult:
    policy: str
    num_slots: int
    block_size: int
    num_requests: int
    finished: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)
    preemptions: int = 0
    steps: int = 0
    loaded_steps: int = 0
    fragmentation_blocked_steps: int = 0
    max_concurrent: int = 0
    utilization: float = 0.0
    utilization_basis: str = "loaded"
    peak_utilization: float = 0.0
    unused_per_seq: float = 0.0
    unused_per_seq_max: float = 0.0
    mean_usage: dict = field(default_factory=dict)
    history: list[StepRecord] | None = None  # with record_history=True
    timeline: Timeline | None = None

    def summary(self) -> dict:
        """Plain numbers, ready for JSON."""
        return {
            "policy": self.policy, "num_slots": self.num_slots, "block_size": self.block_size,
            "utilization": round(self.utilization, 4), "utilization_basis": self.utilization_basis,
            "peak_utilization": round(self.peak_utilization, 4), "max_concurrent": self.max_concurrent,
            "refused": len(self.refused), "finished": self.finished, "preemptions": self.preemptions,
            "steps": self.steps, "loaded_steps": self.loaded_steps,
            "fragmentation_blocked_steps": self.fragmentation_blocked_steps,
            "unused_per_seq": round(self.unused_per_seq, 2), "unused_per_seq_max": round(self.unused_per_seq_max, 2),
            "mean_usage": {k: round(v, 4) for k, v in self.mean_usage.items()},
        }


class _Live:
    """A request inside the simulation; after a preemption its prompt is everything computed so far."""

    def __init__(self, request: Request):
        self.request = request
        self.id = request.request_id
        self.prompt_len = request.prompt_len
        self.max_new_tokens = request.max_tokens
        self.final_len = request.final_len
        self.running = False

    def sizes(self) -> tuple[int, int, int]:
        return self.prompt_len, self.max_new_tokens, self.final_len


def _snapshot(policy: KVPolicy, running: list[_Live], usage: Usage, timeline: Timeline, step: int) -> None:
    bs = policy.block_size
    per_cell = timeline.cell_slots // bs  # a cell is whole blocks; it shows its first slot
    cells = -(-policy.num_blocks // per_cell)
    idle = EXTERNAL if usage.external else FREE
    owner, state = [-1] * cells, [idle] * cells
    for live in running:
        tokens = policy.num_tokens(live.id)
        blocks = policy.allocated_blocks(live.id)
        if isinstance(blocks, range):  # consecutive blocks: jump straight to those that start a cell
            first = blocks.start + (-blocks.start) % per_cell
            visits = ((b - blocks.start, b) for b in range(first, blocks.stop, per_cell))
        else:
            visits = ((i, b) for i, b in enumerate(blocks) if b % per_cell == 0)
        for logical_block, block in visits:
            position = logical_block * bs
            cell = block // per_cell
            owner[cell] = live.id
            if position < tokens:
                state[cell] = TOKEN
            elif position < live.final_len:
                state[cell] = RESERVED
            else:
                state[cell] = INTERNAL
    timeline.steps.append(step)
    timeline.owner.append(owner)
    timeline.state.append(state)


def simulate(policy: KVPolicy, requests: list[Request], *, record_history: bool = False,
             timeline_steps: int = 0, timeline_every: int = 1, timeline_cells: int = 512,
             max_steps: int = 10_000_000
             ) -> SimulationResult:
    """Run the trace to completion on an empty ``policy``; the policy ends empty again.

    record_history keeps a StepRecord per simulated step (idle stretches with nothing to do are
    skipped, so there may be fewer records than ``steps``). timeline_steps > 0 records a memory map: that many
    snapshots, one every timeline_every steps from the start, each at most timeline_cells cells.
    """
    if policy.seq_ids():
        raise ValueError("policy must be empty when the simulation starts")
    result = SimulationResult(policy.label, policy.num_slots, policy.block_size, len(requests))
    result.history = [] if record_history else None
    if timeline_steps:
        blocks_per_cell = max(1, -(-policy.num_blocks // timeline_cells))
        cell_slots = blocks_per_cell * policy.block_size
        result.timeline = Timeline(policy.label, policy.num_slots, policy.block_size, cell_slots)

    arrivals = deque(sorted(requests, key=lambda r: (r.arrival_step, r.request_id)))
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    sums = dict.fromkeys(USAGE_TERMS, 0.0)
    busy_sums, busy_util, loaded_util, busy_steps = dict.fromkeys(USAGE_TERMS, 0.0), 0.0, 0.0, 0
    unused_sum, unused_steps = 0.0, 0
    step = 0
    while arrivals or waiting or running:
        if step >= max_steps:
            raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
        if not waiting and not running and arrivals[0].arrival_step > step:
            step = arrivals[0].arrival_step  # nothing to do until the next arrival
        while arrivals and arrivals[0].arrival_step <= step:
            waiting.append(_Live(arrivals.popleft()))

        while waiting:  # 2. admission, first come first served
            head = waiting[0]
            try:
                fits = policy.can_allocate(*head.sizes())
            except ValueError as refusal:
                result.refused.append((head.id, str(refusal)))
                waiting.popleft()
                continue
            if not fits:
                break
            policy.allocate(head.id, *head.sizes())
            policy.append_slots(head.id, head.prompt_len)
            head.running = True
            running.append(waiting.popleft())

        for live in list(running):  # 3. decode one token each
            while live.running:
                try:
                    policy.append_slots(live.id, 1)
                    break
                except NoFreeMemory:
                    victim = running.pop()  # the most recently admitted
                    computed = policy.num_tokens(victim.id)
                    policy.free(victim.id)
                    victim.running = False
                    victim.max_new_tokens -= computed - victim.prompt_len
                    victim.prompt_len = computed  # recomputed as a longer prompt on re-admission
                    waiting.appendleft(victim)
                    result.preemptions += 1
        result.max_concurrent = max(result.max_concurrent, len(running))

        usage = policy.usage(waiting[0].sizes() if waiting else None)  # 4. record
        if record_history:
            result.history.append(StepRecord(step, usage, len(running), len(waiting)))
        if (result.timeline is not None and len(result.timeline.steps) < timeline_steps
                and step % timeline_every == 0):
            _snapshot(policy, running, usage, result.timeline, step)
        result.peak_utilization = max(result.peak_utilization, usage.utilization)
        if usage.num_seqs:
            unused = (usage.reserved + usage.internal) / usage.num_seqs
            unused_sum, unused_steps = unused_sum + unused, unused_steps + 1
            result.unused_per_seq_max = max(result.unused_per_seq_max, unused)
        if usage.occupied:
            busy_steps += 1
            busy_util += usage.utilization
            for term in USAGE_TERMS:
                busy_sums[term] += getattr(usage, term)
        if waiting:
            result.loaded_steps += 1
            loaded_util += usage.utilization
            result.fragmentation_blocked_steps += usage.external > 0
            for term in USAGE_TERMS:
                sums[term] += getattr(usage, term)

        still_running = []
        for live in running:
            if policy.num_tokens(live.id) >= live.final_len:
                policy.free(live.id)
                result.finished += 1
            else:
                still_running.append(live)
        running = still_running
        step += 1

    result.steps = step
    result.unused_per_seq = unused_sum / unused_steps if unused_steps else 0.0
    if result.loaded_steps:
        count, util = result.loaded_steps, loaded_util
    else:
        result.utilization_basis = "busy"
        count, util, sums = busy_steps, busy_util, busy_sums
    if count:
        result.utilization = util / count
        result.mean_usage = {term: sums[term] / count / policy.num_slots for term in USAGE_TERMS}
    return result
