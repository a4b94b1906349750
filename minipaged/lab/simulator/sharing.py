"""Memory saved by sharing blocks (chapter 05), simulated on a request trace with the real "shared" policy.

Both modes run the trace through the engine core itself (core.py) with a synthetic runner: the real
scheduler, admission, forks, frees and preemption, with no model. Two ways one request becomes
several sequences:

    parallel sampling, n samples   the prompt is prefilled once and forked n - 1 times; every sample
                                   then grows on its own. Sample 0 generates the trace's output length,
                                   the others lengths drawn from the same trace (seeded), so samples
                                   end at different times, as real ones do.
    beam search, width k           the core's beam search (select_beams, and the take over / fork /
                                   prune moves of beam_search.py) runs for the trace's output
                                   length. The model is replaced by synthetic
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

Every step is one of the core's steps (a forward pass on a model), recorded after the step's
blocks are planned and its copies on write made, before the finished sequences give theirs back.
Everything waits from step 0 and is admitted first come, first served, as the pool allows (the
simulate command's default arrival rate keeps its queue full anyway). When the pool runs dry the
newest request is preempted by recompute, as chapter 06's scheduler does: a beam search comes back
whole, parallel samples one by one, unshared.

Not modelled: EOS for beams (no beam ends early), stop strings, time per step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from minipaged.kv.shared import SharedPolicy
from minipaged.lab.simulator.workloads import Request
from minipaged.sampling_params import BeamSearchParams
from minipaged.scheduler import RequestStatus

MODES = ("parallel", "beam")
SYNTHETIC_VOCAB = 49152  # SmolLM2's vocabulary size
STEEPNESS = [1.0 + 0.05 * i for i in range(41)]  # s in [1, 3]; p(rank r) ~ r^-s

# The vLLM paper (SOSP'23, section 6.3, OPT-13B): memory saved by sharing, as a range over n (parallel
# sampling) and beam width 2..6, per trace. Alpaca's ranges are also drawn in its Fig. 15; ShareGPT's are
# given in the text only. Quoted for comparison, never computed here.
PAPER_SAVED = {"alpaca": {"parallel": (0.061, 0.098), "beam": (0.376, 0.552)},
               "sharegpt": {"parallel": (0.162, 0.305), "beam": (0.443, 0.663)}}


@dataclass
class SharingResult:
    mode: str  # "parallel" or "beam"
    n: int  # samples, or beam width
    requests: int
    block_size: int
    physical: list[int] = field(default_factory=list)  # per step: blocks in use
    logical: list[int] = field(default_factory=list)  # per step: blocks the same sequences would hold unshared
    forks: int = 0
    cow_copies: int = 0
    preemptions: int = 0
    finished: int = 0
    refused: int = 0

    @property
    def steps(self) -> int:
        return len(self.physical)

    @property
    def saved_fraction(self) -> float:
        return 1 - sum(self.physical) / sum(self.logical) if sum(self.logical) else 0.0

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        return {"mode": self.mode, "n": self.n, "requests": self.requests, "saved": round(self.saved_fraction, 4),
                "steps": self.steps, "mean_physical_blocks": round(sum(self.physical) / steps, 1),
                "mean_logical_blocks": round(sum(self.logical) / steps, 1),
                "peak_physical_blocks": max(self.physical, default=0),
                "peak_logical_blocks": max(self.logical, default=0),
                "forks": self.forks, "cow_copies": self.cow_copies, "preemptions": self.preemptions,
                "finished": self.finished, "refused": self.refused}


# ---- both modes run through the engine core ------------------------------------------------------

def _core(policy: SharedPolicy, runner, eos_token_id=None):
    """The engine core (core.py) over this policy and a synthetic runner: the real scheduler and
    admission, forks, frees and preemption; no model."""
    from minipaged.config import EngineArgs
    from minipaged.core import EngineCore

    args = EngineArgs(model="synthetic", kv_policy=policy.name, block_size=policy.block_size,
                      kv_capacity_tokens=policy.num_slots, max_num_seqs=1 << 30).validate()
    return EngineCore(args, policy, runner, None, eos_token_id, policy.max_model_len)


def _run(core, result: SharingResult) -> None:
    """Step the core to the end; every step's blocks in use (with and without sharing) go to result."""
    with core.metrics.steps.recording() as rec:
        while core.has_unfinished_requests():
            core.step()
    result.physical = [record["blocks_physical"] for record in rec.records]
    result.logical = [record["blocks_logical"] for record in rec.records]
    result.forks = core.stats.get("forks", 0)
    result.preemptions = core.stats.get("preemptions", 0)
    result.cow_copies = core.runner.num_copies


# ---- parallel sampling ------------------------------------------------------------------------

EOS = 0  # the synthetic end-of-sequence token: a sample emits it when it reaches its length


def _sample_lengths(requests: list[Request], n: int, max_model_len: int, seed: int) -> list[list[int]]:
    """Final length of each of the n samples of every request (sample 0: the trace's own)."""
    rng = random.Random(seed)
    outputs = [r.output_len for r in requests]
    return [[r.final_len] + [r.prompt_len + min(rng.choice(outputs), max_model_len - r.prompt_len)
                             for _ in range(n - 1)] for r in requests]


def simulate_parallel(policy: SharedPolicy, requests: list[Request], n: int, seed: int = 0) -> SharingResult:
    """Every request samples n outputs that share its prompt's blocks: the core prefills the prompt
    once and forks it n - 1 times (as ``LLM.generate`` does with SamplingParams(n=...)). Sample i
    runs to its own length (drawn from the trace), then emits EOS.

    When a sample finds no free block the scheduler preempts the newest request by recompute: its
    samples come back one by one, each prefilled on its own (chapter 06)."""
    from minipaged.lab.simulator.runner import SyntheticRunner
    from minipaged.sampling_params import SamplingParams

    if policy.seq_ids():
        raise ValueError("policy must be empty when the simulation starts")
    result = SharingResult("parallel", n, len(requests), policy.block_size)
    target: dict[int, int] = {}  # seq_id -> how many tokens it generates

    def token_of(seq) -> int:
        return EOS if len(seq.output_ids) + 1 >= target[seq.seq_id] else 7

    core = _core(policy, SyntheticRunner(token_of=token_of), eos_token_id=EOS)
    for r, finals in zip(requests, _sample_lengths(requests, n, policy.max_model_len, seed)):
        params = SamplingParams(n=n, max_tokens=max(finals) - r.prompt_len)
        request = core.add_request(str(r.request_id), [1] * r.prompt_len, params)
        for seq, final in zip(request.samples, finals):
            target[seq.seq_id] = final - r.prompt_len
    _run(core, result)
    samples = [(req, s) for req in core.requests.values() for s in req.samples]
    result.refused = sum(req.status is RequestStatus.REFUSED and s.finish_reason == "abort" for req, s in samples)
    result.finished = len(samples) - result.refused
    return result


# ---- beam search ------------------------------------------------------------------------------

def synthetic_candidates(seed: int):
    """candidates_of(width) for a synthetic runner: a beam's 2 * width best (token, logprob) under
    p(rank r) ~ r^-s, with s drawn from STEEPNESS for every beam and step."""
    rng, tables = random.Random(seed), {}

    def candidates(width: int) -> list[tuple[int, float]]:
        s = rng.choice(STEEPNESS)
        if s not in tables:
            log_z = math.log(sum(r ** -s for r in range(1, SYNTHETIC_VOCAB + 1)))
            tables[s] = [(r, -s * math.log(r) - log_z) for r in range(1, 64)]
        return tables[s][:2 * width]

    return candidates


def simulate_beam(policy: SharedPolicy, requests: list[Request], width: int, seed: int = 0) -> SharingResult:
    """Every request runs a beam search of this width for its trace output length, in the engine core
    with synthetic next-token log-probabilities (``synthetic_candidates``)."""
    from minipaged.lab.simulator.runner import SyntheticRunner

    if policy.seq_ids():
        raise ValueError("policy must be empty when the simulation starts")
    if 2 * width > 63:
        raise ValueError(f"width={width} is too large for the synthetic model (at most 31)")
    result = SharingResult("beam", width, len(requests), policy.block_size)
    core = _core(policy, SyntheticRunner(candidates_of=synthetic_candidates(seed)))
    params = BeamSearchParams(beam_width=width, max_tokens=policy.max_model_len)
    for r in requests:
        core.add_beam_request(str(r.request_id), [0] * r.prompt_len, params, max_tokens=r.output_len)
    _run(core, result)
    outputs = [req.beam.output for req in core.requests.values()]
    result.refused = sum(o.refused is not None for o in outputs)
    result.finished = len(outputs) - result.refused
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
