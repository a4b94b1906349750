"""Memory saved by sharing blocks (chapter 05), simulated on a request trace with the real "shared" policy.

Two ways one request becomes several sequences:

    parallel sampling, n samples   the prompt is prefilled once and forked n - 1 times; every sample
                                   then grows on its own. Sample 0 generates the trace's output length,
                                   the others lengths drawn from the same trace (seeded), so samples
                                   end at different times, as real ones do.
    beam search, width k           minipaged.beam_search's own loop (BeamSearch, select_beams, the
                                   fork / take over / prune bookkeeping of PolicyBeams) runs for the
                                   trace's output length. The model is replaced by synthetic
                                   next-token log-probabilities: for each beam and step, a Zipf-shaped
                                   distribution over a 49,152-token vocabulary, p(rank r) ~ r^-s, with
                                   the steepness s drawn uniformly from [1, 3] (top-token probability
                                   from about 0.09 to 0.83). That choice decides how often beams branch
                                   and die, so the beam-search figure measures this model of a language
                                   model, not SmolLM2; the chapter sets it beside a real-model run.

Every step records the blocks in use (``policy.sharing().physical_blocks``) and the blocks the same
live sequences would hold without sharing (the sum of their block-table lengths: exactly what the
unshared on_demand policy takes for them). The memory saved is

    saved = 1 - sum over steps of physical / sum over steps of logical

that is, the time-averaged KV memory with sharing against without, for the same sequences.

Everything waits from step 0 and is admitted first come, first served, as the pool allows (the
simulate command's default arrival rate keeps its queue full anyway). A sequence that finds no free
block preempts the newest request as a whole: its sequences give their blocks back and it starts
over from its prompt later, so preemption never turns shared blocks into private copies.

Not modelled: EOS (no beam ends early), stop strings, time per step.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from minipaged.beam_search import BeamSearch, BeamSearchParams, PolicyBeams
from minipaged.kv.base import NoFreeMemory, blocks_for
from minipaged.kv.shared import SharedPolicy
from minipaged.simulator.workloads import Request

MODES = ("parallel", "beam")
SYNTHETIC_VOCAB = 49152  # SmolLM2's vocabulary size
STEEPNESS = [1.0 + 0.05 * i for i in range(41)]  # s in [1, 3]; p(rank r) ~ r^-s

# The vLLM paper (SOSP'23, section 6.3, Alpaca trace, OPT-13B): memory saved by sharing, as a range
# over n (parallel sampling) and beam width 2..6. Quoted for comparison, never computed here.
PAPER_ALPACA_SAVED = {"parallel": (0.061, 0.098), "beam": (0.376, 0.552)}


@dataclass
class SharingResult:
    mode: str  # "parallel" or "beam"
    n: int  # samples, or beam width
    requests: int
    block_size: int
    steps: int = 0
    physical_block_steps: int = 0  # sum over steps of blocks in use
    logical_block_steps: int = 0  # sum over steps of blocks the same sequences would hold unshared
    peak_physical_blocks: int = 0
    peak_logical_blocks: int = 0
    forks: int = 0
    cow_copies: int = 0
    preemptions: int = 0
    finished: int = 0
    refused: int = 0

    @property
    def saved_fraction(self) -> float:
        if not self.logical_block_steps:
            return 0.0
        return 1 - self.physical_block_steps / self.logical_block_steps

    def record(self, policy: SharedPolicy) -> None:
        sharing = policy.sharing()
        self.steps += 1
        self.physical_block_steps += sharing.physical_blocks
        self.logical_block_steps += sharing.logical_blocks
        self.peak_physical_blocks = max(self.peak_physical_blocks, sharing.physical_blocks)
        self.peak_logical_blocks = max(self.peak_logical_blocks, sharing.logical_blocks)

    def summary(self) -> dict:
        return {"mode": self.mode, "n": self.n, "requests": self.requests, "saved": round(self.saved_fraction, 4),
                "steps": self.steps, "mean_physical_blocks": round(self.physical_block_steps / max(self.steps, 1), 1),
                "mean_logical_blocks": round(self.logical_block_steps / max(self.steps, 1), 1),
                "peak_physical_blocks": self.peak_physical_blocks, "peak_logical_blocks": self.peak_logical_blocks,
                "forks": self.forks, "cow_copies": self.cow_copies, "preemptions": self.preemptions,
                "finished": self.finished, "refused": self.refused}


# ---- parallel sampling ------------------------------------------------------------------------

@dataclass
class _Family:
    """The samples of one request that have not finished yet."""

    request: Request
    finals: list[int]  # final length of each unfinished sample
    ids: list[int] = field(default_factory=list)  # their sequence ids while running


def _sample_lengths(requests: list[Request], n: int, max_model_len: int, seed: int) -> list[list[int]]:
    """Final length of each of the n samples of every request (sample 0: the trace's own)."""
    rng = random.Random(seed)
    outputs = [r.output_len for r in requests]
    return [[r.final_len] + [r.prompt_len + min(rng.choice(outputs), max_model_len - r.prompt_len)
                             for _ in range(n - 1)] for r in requests]


def family_worst_case_blocks(prompt_len: int, finals: list[int], block_size: int) -> int:
    """Blocks a family holds at most: the full prompt blocks once, every sample's other blocks."""
    shared = prompt_len // block_size
    return shared + sum(blocks_for(final, block_size) - shared for final in finals)


def simulate_parallel(policy: SharedPolicy, requests: list[Request], n: int, seed: int = 0,
                      max_steps: int = 10_000_000) -> SharingResult:
    """Every request samples n outputs that share its prompt's blocks.

    A sample that finds no free block preempts the newest request: all of its unfinished samples
    give their blocks back and the request starts over from its prompt later, prefilled once and
    forked again, so that preemption never turns shared blocks into private copies.
    """
    if policy.seq_ids():
        raise ValueError("policy must be empty when the simulation starts")
    result = SharingResult("parallel", n, len(requests), policy.block_size)
    waiting = deque(_Family(r, finals) for r, finals in zip(requests, _sample_lengths(
        requests, n, policy.max_model_len, seed)))
    running: list[_Family] = []
    ids = iter(range(1 << 62))
    while waiting or running:
        if result.steps >= max_steps:
            raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
        while waiting:  # admission, first come first served
            family = waiting[0]
            prompt_len = family.request.prompt_len
            try:
                worst = family_worst_case_blocks(prompt_len, family.finals, policy.block_size)
                if worst > policy.num_blocks:
                    raise ValueError(f"{len(family.finals)} samples may need {worst} blocks")
                if not policy.can_allocate(prompt_len, max(family.finals) - prompt_len):
                    break
            except ValueError:
                waiting.popleft()
                result.refused += 1
                continue
            waiting.popleft()
            family.ids = [next(ids) for _ in family.finals]
            parent = family.ids[0]
            policy.allocate(parent, prompt_len, family.finals[0] - prompt_len, final_len=family.finals[0])
            policy.append_slots(parent, prompt_len)  # the prompt, prefilled once
            for child, final in zip(family.ids[1:], family.finals[1:]):
                policy.fork(parent, child, final_len=final)
                result.forks += 1
            running.append(family)

        i, j = 0, 0  # decode: one token for sample j of family i
        while i < len(running):
            family = running[i]
            if j == len(family.ids):
                i, j = i + 1, 0
                continue
            try:
                policy.append_slots(family.ids[j], 1)
                j += 1
            except NoFreeMemory:  # nothing changed; the newest family starts over
                victim = running.pop()
                for sid in victim.ids:
                    policy.free(sid)
                victim.ids = []
                waiting.appendleft(victim)
                result.preemptions += 1
                if victim is family:
                    break
        result.cow_copies += len(policy.drain_copies())  # the engine would copy these blocks now
        result.record(policy)

        for family in list(running):
            keep = [(sid, final) for sid, final in zip(family.ids, family.finals) if policy.num_tokens(sid) < final]
            for sid, final in zip(family.ids, family.finals):
                if policy.num_tokens(sid) >= final:
                    policy.free(sid)
                    result.finished += 1
            family.ids, family.finals = [sid for sid, _ in keep], [final for _, final in keep]
            if not family.ids:
                running.remove(family)
    return result


# ---- beam search ------------------------------------------------------------------------------

class SyntheticBeams(PolicyBeams):
    """PolicyBeams whose forward pass draws synthetic log-probabilities instead of running a model."""

    def __init__(self, policy: SharedPolicy, result: SharingResult, seed: int):
        super().__init__(policy)
        self.result, self.rng = result, random.Random(seed)
        self._tables: dict[float, list[tuple[int, float]]] = {}

    def _candidates(self, s: float, count: int) -> list[tuple[int, float]]:
        """The count most likely (token, logprob) of p(rank r) ~ r^-s over the vocabulary."""
        if s not in self._tables:
            log_z = math.log(sum(r ** -s for r in range(1, SYNTHETIC_VOCAB + 1)))
            self._tables[s] = [(r, -s * math.log(r) - log_z) for r in range(1, 64)]
        return self._tables[s][:count]

    def forward(self, work, width: int, temperature: float):
        self.result.cow_copies += len(self.policy.drain_copies())
        self.result.record(self.policy)
        return [self._candidates(self.rng.choice(STEEPNESS), 2 * width) for _ in work]


def simulate_beam(policy: SharedPolicy, requests: list[Request], width: int, seed: int = 0) -> SharingResult:
    """Every request runs a beam search of this width for its trace output length."""
    if policy.seq_ids():
        raise ValueError("policy must be empty when the simulation starts")
    if 2 * width > 63:
        raise ValueError(f"width={width} is too large for the synthetic model (at most 31)")
    result = SharingResult("beam", width, len(requests), policy.block_size)
    backend = SyntheticBeams(policy, result, seed)
    search = BeamSearch(backend, BeamSearchParams(beam_width=width, max_tokens=policy.max_model_len),
                        eos_token_id=None, max_num_seqs=1 << 30)
    outputs = search.run([[0] * r.prompt_len for r in requests], policy.max_model_len, tokenizer=None,
                         max_tokens=[r.output_len for r in requests])
    result.refused = sum(o.refused is not None for o in outputs)
    result.finished = len(outputs) - result.refused
    result.forks, result.preemptions = backend.stats["forks"], backend.stats["preemptions"]
    return result


def simulate_sharing(mode: str, requests: list[Request], n: int, *, capacity: int = 32768, block_size: int = 16,
                     max_model_len: int = 2048, seed: int = 0) -> SharingResult:
    """One run on a fresh "shared" policy: mode "parallel" (n samples) or "beam" (width n)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; choose one of {list(MODES)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    policy = SharedPolicy(capacity, block_size=block_size, max_model_len=max_model_len)
    run = simulate_parallel if mode == "parallel" else simulate_beam
    result = run(policy, requests, n, seed=seed)
    policy.check_invariants()
    assert not policy.seq_ids() and policy.num_free_blocks == policy.num_blocks, "the simulation leaked blocks"
    return result
