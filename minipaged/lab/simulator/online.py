"""Chapter 11's load test without the model: the real engine core on a virtual clock.

    from minipaged.lab.simulator.online import StepTimeModel, simulate
    model = StepTimeModel.fit(rows)          # rows: (tokens computed, sequences, seconds) of real steps
    requests = simulate("paged", trace, arrivals, model, kv_capacity=1536, max_model_len=256,
                        max_num_seqs=64, drain=60.0)

Why. On two CPU cores a real server takes seconds per request, so a sweep of many rates, each with
hundreds of requests and repeated over seeds, would take hours. Everything that decides *where* a
system's latency bends is in the scheduler and the KV policy: who is admitted, who waits for a
slab, when a static batch ends. Only the length of each step comes from the model. So this module
runs the real ``EngineCore`` (core.py) with its real scheduler and policy over the
``SyntheticRunner`` (no model), and lets each step take the time a fitted model gives it:

    step seconds = fixed + per_token x (token positions computed) + per_seq x (sequences in the step)

fitted on steps of the real engine, timed in the same benchmark run (``bench online``), so the
simulated seconds are this machine's. The core's clock (``EngineCore.clock``) is a virtual one, which
only the runner moves: arrivals, first tokens and finishes are stamped on it as they would be on
``time.perf_counter``.

The systems are the vLLM paper's (section 6.2), all with the same KV capacity in token slots:

    static       static batching (a batch runs until its longest request ends), contiguous slabs of
                 max_model_len: the FasterTransformer-like baseline
    orca_max     Orca: continuous batching, each request reserves max_model_len slots
    orca_pow2    Orca, each request reserves the next power of two of prompt + max_tokens
    orca_oracle  Orca, each request reserves exactly prompt + output (knowing the output's length
                 in advance is impossible: an upper bound on what reservation can do)
    paged        vLLM: continuous batching, blocks of 16 taken as tokens arrive (the prefix cache
                 off: the trace's prompts are random tokens, and a cache would only serve the
                 benchmark's own repeats)

One step-time model serves all five: it is fitted on the paged engine, and the contiguous systems
run the same model over the same kind of batches (a slab is a run of blocks to the attention).

Not handled yet: the server's own time per step (HTTP, JSON, streaming; ``bench online`` measures
how far the real servers sit from the simulated ones), steps whose time depends on the context
length (attention is a small part of SmolLM2's step at these lengths), requests that stop early,
prefix-cache hits (the trace's prompts are random tokens), chunked prefill and speculation.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from minipaged.lab.simulator.runner import SyntheticRunner

# key -> (label, EngineArgs fields that differ from the engine's defaults)
SYSTEMS = {
    "static": ("static batching + contiguous (max)", {"kv_policy": "contiguous", "scheduler": "static"}),
    "orca_max": ("Orca (max): continuous + contiguous", {"kv_policy": "contiguous", "reservation": "max"}),
    "orca_pow2": ("Orca (pow2): continuous + contiguous", {"kv_policy": "contiguous", "reservation": "pow2"}),
    "orca_oracle": ("Orca (oracle): continuous + contiguous", {"kv_policy": "contiguous", "reservation": "oracle"}),
    # the prefix cache off: the benchmark sends the same prompts more than once (warm-up, seeds, the
    # overhead tries), and a real server's cache hits would make it faster than its simulated twin
    "paged": ("vLLM: continuous + paged", {"enable_prefix_caching": False}),
}


def check_system(key: str) -> None:
    if key not in SYSTEMS:
        raise ValueError(f"system={key!r} is not known; choose among {list(SYSTEMS)}")


@dataclass(frozen=True)
class StepTimeModel:
    """How long one engine step takes: fixed + per_token x tokens computed + per_seq x sequences."""

    fixed_s: float
    per_token_s: float
    per_seq_s: float
    median_error: float = 0.0  # median |predicted - measured| / measured over the fitted steps
    steps: int = 0  # how many steps it was fitted on

    def seconds(self, num_tokens: int, num_seqs: int) -> float:
        return self.fixed_s + self.per_token_s * num_tokens + self.per_seq_s * num_seqs

    @classmethod
    def fit(cls, rows) -> StepTimeModel:
        """Fit on ``rows`` of (tokens computed, sequences, seconds), one per real step.

        The fit minimises each step's error *relative to its own time* (the sum of squared relative
        errors, the steps with a prompt in them weighing as much in all as the decode-only steps):
        a plain least-squares fit is ruled by the slowest (largest-batch) steps and may put
        tens of milliseconds of "fixed" cost on a one-sequence step that really takes 25 ms. Each
        coefficient must be >= 0: every subset of the three terms is fitted, and of the fits with no
        negative coefficient the one with the smallest sum is kept. A term the data cannot tell apart
        from the others (in a decode step the tokens are the sequences) may come out as 0."""
        import numpy as np

        rows = [(float(t), float(s), float(y)) for t, s, y in rows if y > 0]
        if len(rows) < 3:
            raise ValueError(f"StepTimeModel.fit needs at least 3 timed steps, got {len(rows)}")
        data = np.array(rows)  # [steps, 3]
        features = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])  # [steps, 3]
        y = data[:, 2]
        # a serving run has few steps with a prompt in them (tokens > sequences) and many decode steps
        # (tokens = sequences); only the former tell a token's cost from a sequence's, so each kind
        # weighs as much as the other in all
        prefill = data[:, 0] > data[:, 1]
        weight = np.where(prefill, 1.0 / max(prefill.sum(), 1), 1.0 / max((~prefill).sum(), 1))
        best = None
        for size in (3, 2, 1):
            for cols in itertools.combinations(range(3), size):
                a = features[:, cols] / y[:, None] * np.sqrt(weight)[:, None]  # relative error, weighted
                coef, *_ = np.linalg.lstsq(a, np.sqrt(weight), rcond=None)
                if (coef < 0).any():
                    continue
                full = np.zeros(3)
                full[list(cols)] = coef
                loss = float(np.sum(weight * ((features @ full - y) / y) ** 2))
                if best is None or loss < best[1] - 1e-15:
                    best = (full, loss)
        if best is None:
            raise ValueError("StepTimeModel.fit found no fit with non-negative coefficients")
        full = best[0]
        error = float(np.median(np.abs(features @ full - y) / y))
        fixed, per_token, per_seq = full
        return cls(float(fixed), float(per_token), float(per_seq), error, len(rows))

    def as_dict(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_token_s": self.per_token_s, "per_seq_s": self.per_seq_s,
                "median_error": self.median_error, "steps": self.steps}


class _TimedRunner(SyntheticRunner):
    """The SyntheticRunner, plus a clock it moves forward by each step's modelled time."""

    def __init__(self, step_model: StepTimeModel):
        super().__init__()
        self.step_model, self.now = step_model, 0.0

    def execute(self, plan):
        out = super().execute(plan)
        if plan.work:
            out.forward_seconds = self.step_model.seconds(plan.num_tokens, len(plan.work))
            self.now += out.forward_seconds
        return out


def make_core(system: str, step_model: StepTimeModel, *, kv_capacity: int, max_model_len: int,
              max_num_seqs: int, block_size: int = 16):
    """The real EngineCore for ``system`` over a timed synthetic runner; ``core.clock`` is virtual."""
    from minipaged.config import EngineArgs
    from minipaged.core import EngineCore
    from minipaged.kv.factory import make_policy

    check_system(system)
    args = EngineArgs(model="synthetic", kv_capacity_tokens=kv_capacity, block_size=block_size,
                      max_num_seqs=max_num_seqs, max_model_len=max_model_len, **SYSTEMS[system][1]).validate()
    args.check_pool(max_model_len, 1, lambda device: None)  # one slab at least, whatever the memory
    policy = make_policy(args.kv_policy, num_slots=args.kv_capacity_tokens, block_size=args.block_size,
                         max_model_len=max_model_len, reservation=args.reservation)
    runner = _TimedRunner(step_model)
    core = EngineCore(args, policy, runner, None, None, max_model_len)
    core.clock = lambda: runner.now
    return core


def simulate(system: str, trace, arrivals, step_model: StepTimeModel, *, kv_capacity: int, max_model_len: int,
             max_num_seqs: int, drain: float | None = None, block_size: int = 16) -> list[dict]:
    """Serve ``trace`` ([(prompt ids, output length)]) arriving at ``arrivals`` (s) on a virtual clock.

    Returns one record per request in the shape ``bench online``'s load generator writes
    (``arrival_s``, ``chunk_s``: the time of each token, ``end_s``, ``output_tokens``, ``status``),
    so the same summary reads both. With ``drain`` the run stops ``drain`` seconds after the last
    arrival, and a request not finished by then is "unfinished", as the real benchmark's cap makes it
    (a step that ends past the cap counts as not done: the real client has hung up by then). Without
    it the run goes on until every request has finished: virtual time costs nothing."""
    from minipaged.sampling_params import SamplingParams

    if len(trace) != len(arrivals):
        raise ValueError(f"trace has {len(trace)} requests but arrivals has {len(arrivals)}")
    core = make_core(system, step_model, kv_capacity=kv_capacity, max_model_len=max_model_len,
                     max_num_seqs=max_num_seqs, block_size=block_size)
    runner = core.runner
    order = sorted(range(len(trace)), key=lambda i: arrivals[i])
    records = [{"arrival_s": a, "expected_tokens": n, "prompt_tokens": len(p), "sent_s": a, "end_s": None,
                "output_tokens": None, "chunk_s": [], "tokens_seen": 0, "status": "unfinished"}
               for (p, n), a in zip(trace, arrivals)]
    cap = max(arrivals) + drain if drain is not None else float("inf")
    nxt = 0
    while runner.now <= cap:
        while nxt < len(order) and arrivals[order[nxt]] <= runner.now:
            i = order[nxt]
            prompt, n = trace[i]
            core.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                             arrival_time=arrivals[i])
            nxt += 1
        if not core.has_unfinished_requests():
            if nxt == len(order):
                break
            runner.now = arrivals[order[nxt]]  # idle until the next arrival
            continue
        changed = core.step()
        if runner.now > cap:
            break  # this step ended after the cap: its tokens never reached a client
        for request_id in changed:
            request, record = core.requests[request_id], records[int(request_id)]
            tokens = sum(len(s.output_ids) for s in request.samples)
            if tokens > record["tokens_seen"]:  # one event per step that made tokens, as the server streams
                record["chunk_s"].append(runner.now)
                record["tokens_seen"] = tokens
            if request.finished:
                record["end_s"] = request.finished_time
                record["output_tokens"] = tokens
                if request.status.name != "FINISHED":
                    record["status"] = f"error: {request.status.name.lower()}"
                elif record["output_tokens"] != record["expected_tokens"]:
                    record["status"] = (f"error: {record['output_tokens']} output tokens, asked for "
                                        f"{record['expected_tokens']}")
                else:
                    record["status"] = "ok"
                core.pop_finished(request_id)
    return records
