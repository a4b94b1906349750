"""Chapter 06 at random: every request ends, served or refused with a reason, and nothing leaks.

Whatever the KV policy, the block size, the pool (from a few blocks up), the samples per request,
the prompts, the preemption mode and swap space, the scheduler, chunked prefill, the step limits and
the watermark, every request must end: each of its samples either served ("length" or "stop") or
refused ("abort", with a stop_reason that says "refused: ..."). Never a RuntimeError from the core
("can neither be scheduled nor refused"), never a run that does not end (the steps are counted and
bounded), and afterwards no block held: the policy keeps no sequence, its whole pool is free, the
swap space is empty, and the policies' own invariants hold after every step.

A request is refused exactly when one of its samples alone could never fit the whole pool: samples
that fit one by one but not side by side are served (split into one request each), and a swapped-out
request that cannot come back into an empty pool is recomputed instead.

Two layers:

* the real engine core (core.py) with the model-free ``SyntheticRunner`` (minipaged/lab/simulator/runner.py), for many
  random cases. Its next token is a fixed function of the sample's index and its tokens so far, so
  every served sample's output is known in closed form: a token lost or repeated across a
  preemption, a fork or a chunk shows up as a wrong output. Some requests stop at an EOS token.
  The runner also stands in for the K/V tensors (``KVTrackingRunner``): it makes the plan's swap
  and copy-on-write copies and checks that every sequence reads back its own tokens, so a block
  copy that never happened is caught without a model.
* hand-picked cases, on both layers, so that each path (swap of n > 1, splitting samples, refusal,
  swap fallback, chunked prefill) is taken even if the random cases stopped reaching it.
* fewer cases through ``LLM("tiny")``: greedy outputs under pressure must equal, token for token,
  those of the same prompts in an unpressured pool.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from minipaged import LLM, SamplingParams
from minipaged.config import EngineArgs
from minipaged.core import EngineCore
from minipaged.kv import make_policy
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.scheduler import RequestStatus

POLICIES = ["on_demand", "shared", "prefix_caching", "block_table"]
BLOCK_SIZES = [1, 2, 4, 8, 16]
WATERMARKS = [0.0, 0.01, 0.25]  # 0.01 is the default
EOS = 9  # the synthetic runner's EOS token


def step_bound(requests) -> int:
    """A generous number of engine steps for the requests to end: each sample's tokens could be
    recomputed a few times over, one token per step, plus room for arrivals and refusals."""
    work = sum(n * (len(prompt) + max_tokens) for prompt, max_tokens, n, *_ in requests)
    return 20 * work + 200


# ---- the synthetic core ---------------------------------------------------------------------------

def synthetic_token(index: int, ids) -> int:
    """The synthetic "model": sample ``index``'s next token after ``ids`` (one in ten is EOS)."""
    return (sum(ids) * 31 + len(ids) * 7 + index * 13 + 3) % 10


def expected_output(index: int, prompt, max_new: int, ignore_eos: bool) -> tuple[list[int], str]:
    out: list[int] = []
    while len(out) < max_new:
        out.append(synthetic_token(index, prompt + out))
        if not ignore_eos and out[-1] == EOS:
            return out, "stop"
    return out, "length"


def engine_args(context_len: int, **options) -> EngineArgs | None:
    """The validated args, or None for a combination the engine refuses to build (then the case is
    skipped): EngineArgs.validate(), and the pool check that needs the model (memory left unknown)."""
    try:
        args = EngineArgs(progress=False, **options).validate()
        args.check_pool(context_len, 1, lambda device: None)
    except ValueError:
        return None
    return args


def build_policy(args: EngineArgs, max_model_len: int):
    """An empty KV policy, as build.build_core builds it."""
    options = {"watermark": args.watermark} if args.kv_policy in ("on_demand", "shared", "prefix_caching") else {}
    return make_policy(args.kv_policy, num_slots=args.kv_capacity_tokens, block_size=args.block_size,
                       max_model_len=max_model_len, reservation=args.reservation, **options)


def prefix_marks(ids) -> list[int]:
    """What the K/V of token i of ``ids`` stands for: a hash of the token and every one before it."""
    marks, h = [], 0
    for t in ids:
        h = (h * 1_000_003 + t + 1) % (1 << 61)
        marks.append(h)
    return marks


class KVTrackingRunner(SyntheticRunner):
    """The synthetic runner, plus a stand-in for the K/V tensors: each device and swap slot remembers
    which token (and prefix) was written there. It makes the plan's copies in the model runner's
    order (swap-outs, swap-ins, copies on write), writes the planned tokens, and then checks that every
    planned sequence reads back exactly its own tokens through its block table: a copy the core never
    made, or a block handed to two sequences, shows up here."""

    def __init__(self, policy, **options):
        super().__init__(**options)
        self.policy = policy  # read only: the block tables, to check what each sequence reads back
        self.device: dict[int, int] = {}
        self.host: dict[int, int] = {}

    def _copy(self, src: dict, dst: dict, copies) -> None:
        bs = self.policy.block_size
        for a, b in copies:
            for off in range(bs):
                dst[b * bs + off] = src.get(a * bs + off)

    def execute(self, plan):
        self._copy(self.device, self.host, plan.swap_out)
        self._copy(self.host, self.device, plan.swap_in)
        self._copy(self.device, self.device, plan.copies)
        for work in plan.work:
            marks = prefix_marks(work.seq.all_ids[:work.cached + work.num_own])
            for i, slot in enumerate(work.slots[:work.num_own]):
                self.device[slot] = marks[work.cached + i]
        for work in plan.work:
            seq = work.seq
            read = [self.device.get(slot) for slot in self.policy.token_slots(seq.seq_id)]
            want = prefix_marks(seq.all_ids[:work.cached + work.num_own])
            bad = [i for i, (r, w) in enumerate(zip(read, want)) if r != w]
            assert len(read) == len(want) and not bad, (
                f"seq {seq.seq_id} (request sample {seq.index}) reads back wrong K/V at positions {bad[:8]} of "
                f"{len(want)} (its step computes {work.cached}..{work.cached + work.num_own})")
        return super().execute(plan)  # the tokens, as the synthetic runner draws them


def build_core(args: EngineArgs, max_model_len: int) -> EngineCore:
    """As build.build_core builds it, with the synthetic runner instead of the model."""
    policy = build_policy(args, max_model_len)
    runner = KVTrackingRunner(policy, token_of=lambda seq: synthetic_token(seq.index, seq.all_ids))
    return EngineCore(args, policy, runner, None, EOS, max_model_len)


def never_fits_alone(args: EngineArgs, max_model_len: int, prompt_len: int, max_new: int) -> bool:
    """Whether one sample alone could never fit an empty pool of this configuration."""
    fresh = build_policy(args, max_model_len)
    try:
        fresh.can_allocate(prompt_len, max_new)
    except ValueError:
        return True
    return False


def assert_nothing_held(core: EngineCore) -> None:
    policy, sched = core.policy, core.scheduler
    policy.check_invariants()
    assert not policy.seq_ids(), f"blocks leaked: the policy still holds sequences {policy.seq_ids()}"
    assert policy.num_free_blocks == policy.num_blocks, (
        f"blocks leaked: {policy.num_free_blocks} of {policy.num_blocks} blocks free")
    if core.swap_space is not None:
        core.swap_space.check_invariants()
        assert not core.swap_space.seq_ids(), f"swap space leaked: {core.swap_space.seq_ids()}"
        assert core.swap_space.pool.num_free == core.swap_space.num_blocks, "swap space blocks leaked"
    assert not (sched.waiting or sched.running or sched.swapped), "the scheduler still has queued requests"
    assert not core.has_unfinished_requests() and core.get_num_unfinished_requests() == 0


def run_synthetic(args: EngineArgs, max_model_len: int, requests) -> EngineCore:
    """Serve ``requests`` [(prompt, max_tokens, n, ignore_eos, arrival_step)] through the core, step by
    step, checking the invariants after every step; fails if they take more than ``step_bound``."""
    core = build_core(args, max_model_len)
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i][4])
    bound, steps, nxt = step_bound(requests), 0, 0
    while nxt < len(arrivals) or core.has_unfinished_requests():
        if not core.has_unfinished_requests():  # idle until the next arrival
            steps = max(steps, requests[arrivals[nxt]][4])
        while nxt < len(arrivals) and requests[arrivals[nxt]][4] <= steps:
            i = arrivals[nxt]
            prompt, max_tokens, n, ignore_eos, _ = requests[i]
            core.add_request(str(i), prompt, SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=ignore_eos))
            nxt += 1
        core.step()
        steps += 1
        assert steps <= bound, f"no end after {steps} steps: {len(core.scheduler.waiting)} waiting, " \
                               f"{len(core.scheduler.running)} running, {len(core.scheduler.swapped)} swapped"
        core.policy.check_invariants()
        if core.swap_space is not None:
            core.swap_space.check_invariants()
    return core


def check_synthetic(args: EngineArgs, max_model_len: int, requests) -> dict:
    core = run_synthetic(args, max_model_len, requests)
    for i, (prompt, max_tokens, n, ignore_eos, _) in enumerate(requests):
        request = core.requests[str(i)]
        assert request.finished, f"request {i} did not finish"
        assert len(request.samples) == n
        max_new = min(max_tokens, max_model_len - len(prompt))
        refuse = never_fits_alone(args, max_model_len, len(prompt), max_new)
        for seq in request.samples:
            if refuse:
                assert seq.finish_reason == "abort" and request.status is RequestStatus.REFUSED, (
                    f"request {i} sample {seq.index} can never fit alone, yet ended {seq.finish_reason!r} "
                    f"({seq.stop_reason!r})")
                assert not seq.output_ids
                continue
            assert seq.finish_reason in ("length", "stop"), (
                f"request {i} sample {seq.index} fits the pool alone, yet ended {seq.finish_reason!r} "
                f"({seq.stop_reason!r})")
            want, reason = expected_output(seq.index, prompt, max_new, ignore_eos)
            assert (seq.output_ids, seq.finish_reason) == (want, reason), f"request {i} sample {seq.index}"
    assert_nothing_held(core)
    return core.stats


def pool_blocks(draw, block_size: int, requests, max_model_len: int) -> int:
    """A pool size in blocks. Mostly between the longest sample alone and a fraction of everything
    side by side (so that requests are preempted); sometimes too small for the longest sample (so
    that it is refused, and the others go on); sometimes anything."""
    def longest(prompt, max_tokens):
        return -(-(len(prompt) + min(max_tokens, max_model_len - len(prompt))) // block_size)

    one = max(longest(p, m) for p, m, *_ in requests)
    every = sum(n * longest(p, m) for p, m, n, *_ in requests)
    kind = draw(st.sampled_from(["pressed", "pressed", "pressed", "too small", "any"]))
    if kind == "pressed":
        return draw(st.integers(one, max(one, every * 2 // 3)))
    if kind == "too small":
        return draw(st.integers(max(1, one // 2), max(1, one - 1)))
    return draw(st.integers(1, 64))


def draw_options(draw, model: str, max_batched: int) -> dict:
    """The engine options but the pool. Options that a configuration would ignore stay at their
    defaults (EngineArgs.validate() refuses them), and chunked prefill is mostly drawn where it is
    valid; validate() says which of the rest are."""
    policy = draw(st.sampled_from(POLICIES))
    scheduler = draw(st.sampled_from(["continuous", "static"]))
    chunked = draw(st.booleans()) and (scheduler == "continuous" or draw(st.integers(0, 9)) == 0)
    max_num_seqs = draw(st.integers(1, 12))
    budget = draw(st.one_of(st.none(), st.integers(1, max_batched)))
    if chunked and budget is not None and budget < max_num_seqs and draw(st.integers(0, 9)):
        budget += max_num_seqs
    options = dict(model=model, kv_policy=policy, block_size=draw(st.sampled_from(BLOCK_SIZES)), scheduler=scheduler,
                   preemption_mode=draw(st.sampled_from(["recompute", "swap"])), enable_chunked_prefill=chunked,
                   max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    if policy == "block_table":
        options["reservation"] = draw(st.sampled_from(["oracle", "pow2", "max"]))
    else:
        options["watermark"] = draw(st.sampled_from(WATERMARKS))
    return options


def draw_requests(draw, max_model_len, max_num_seqs, alphabet, max_requests, max_prompt, max_tokens, max_arrival):
    """[(prompt, max_tokens, n, ignore_eos, arrival_step)]. The prompts share prefixes, so a prefix
    cache hits; n stays within max_num_seqs, as the front end checks."""
    base = draw(st.lists(alphabet, max_size=max_prompt))
    requests = []
    for _ in range(draw(st.integers(1, max_requests))):
        prompt = base[:draw(st.integers(0, len(base)))] + draw(st.lists(alphabet, max_size=max_prompt // 2))
        prompt = prompt[:max_model_len - 1] or [1]
        n = min(draw(st.integers(1, 6)), max_num_seqs)
        requests.append((prompt, draw(st.integers(1, max_tokens)), n, draw(st.booleans()),
                         draw(st.one_of(st.just(0), st.integers(0, max_arrival)))))
    return requests


def add_pool(draw, options: dict, requests, max_model_len: int) -> dict:
    bs = options["block_size"]
    num_blocks = pool_blocks(draw, bs, requests, max_model_len)
    options["kv_capacity_tokens"] = num_blocks * bs + draw(st.sampled_from([0, 0, 0, bs - 1]))
    if options["preemption_mode"] == "swap" and draw(st.booleans()):  # else the default: as big as the pool
        options["swap_space_tokens"] = draw(st.integers(0, 2 * num_blocks)) * bs + draw(st.sampled_from([0, bs - 1]))
    return options


@st.composite
def synthetic_cases(draw):
    """(EngineArgs options, max_model_len, requests)."""
    options = draw_options(draw, "synthetic", max_batched=64)
    max_model_len = draw(st.integers(2, 96))
    requests = draw_requests(draw, max_model_len, options["max_num_seqs"], st.integers(0, 5), max_requests=6,
                             max_prompt=40, max_tokens=32, max_arrival=8)
    return add_pool(draw, options, requests, max_model_len), max_model_len, requests


@settings(max_examples=2000, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic_cases())
def test_every_request_is_served_or_refused(case):
    options, max_model_len, requests = case
    args = engine_args(max_model_len, **options)
    assume(args is not None)
    stats = check_synthetic(args, max_model_len, requests)
    event(f"preempted: {stats['preemptions'] > 0}")
    event(f"swapped: {stats['preempted_swap'] > 0}")
    event(f"swap fallback: {stats['swap_fallbacks'] > 0}")
    event(f"refused: {stats['refused'] > 0}")


# Cases picked by hand so that each path the property depends on is taken at least once: if the
# random cases above stopped reaching them, these would still.
GUARDS = {
    "swap of n=3 (the deadlock the core once had)": (
        dict(kv_policy="shared", block_size=4, kv_capacity_tokens=32, preemption_mode="swap", watermark=0.0),
        [([65] * 3, 8, 1, True, 0), ([66], 7, 3, True, 0)], "preempted_swap"),
    "every running request swapped out in one step (the step has no work, its swap copies still count)": (
        dict(kv_policy="shared", block_size=1, kv_capacity_tokens=3, preemption_mode="swap", watermark=0.0),
        [([1], 2, 3, True, 0), ([1], 2, 1, True, 0)], "preempted_swap"),
    "samples that fit only one by one": (
        dict(kv_policy="shared", block_size=2, kv_capacity_tokens=12, watermark=0.0),
        [([1, 2, 3], 8, 4, True, 0)], "preempted_recompute"),
    "a sample longer than the pool is refused, the others served": (
        dict(kv_policy="on_demand", block_size=4, kv_capacity_tokens=16, watermark=0.0),
        [([1] * 5, 20, 2, True, 0), ([2] * 3, 4, 1, True, 0)], "refused"),
    "swap space too small: recompute instead": (
        dict(kv_policy="prefix_caching", block_size=2, kv_capacity_tokens=16, preemption_mode="swap",
             swap_space_tokens=2, watermark=0.0),
        [([1, 2, 3], 10, 2, True, 0), ([4, 5], 10, 2, True, 0)], "swap_fallbacks"),
    "chunked prefill, static batching and reserving blocks": (
        dict(kv_policy="block_table", reservation="oracle", block_size=1, kv_capacity_tokens=20,
             enable_chunked_prefill=True, max_num_batched_tokens=4, max_num_seqs=4),
        [([1] * 9, 6, 2, False, 0), ([2] * 4, 12, 1, True, 2), ([3] * 2, 3, 4, True, 3)], None),
}


@pytest.mark.parametrize("name", list(GUARDS))
def test_hand_picked_cases_take_their_path(name):
    options, requests, stat = GUARDS[name]
    args = engine_args(64, model="synthetic", **options)
    assert args is not None, "the guard's options are meant to be valid"
    stats = check_synthetic(args, 64, requests)
    if stat is not None:
        assert stats[stat] > 0, f"{stat} never happened; the guard proves nothing: {stats}"


# ---- the tiny model -------------------------------------------------------------------------------

MODEL_MAX_LEN = 64
MODEL_MAX_TOKENS = 12  # drawn at random
REFERENCE_TOKENS = 24  # computed once per prompt; a shorter greedy output is a prefix of it
_reference: dict[tuple, list[int]] = {}


def reference_outputs(prompts) -> list[list[int]]:
    """Greedy outputs in a pool so big that nothing is ever preempted."""
    missing = list(dict.fromkeys(tuple(p) for p in prompts if tuple(p) not in _reference))
    if missing:
        llm = LLM("tiny", kv_policy="shared", block_size=16, kv_capacity_tokens=1 << 16, max_model_len=MODEL_MAX_LEN,
                  progress=False)
        greedy = SamplingParams(temperature=0, max_tokens=REFERENCE_TOKENS, ignore_eos=True)
        outs = llm.generate([list(p) for p in missing], greedy, use_tqdm=False)
        assert llm.engine.stats["preemptions"] == 0
        for p, o in zip(missing, outs):
            _reference[p] = o.outputs[0].token_ids
    return [_reference[tuple(p)] for p in prompts]


def bound_steps(llm: LLM, bound: int) -> None:
    """Make the engine fail (instead of hang) once it has stepped ``bound`` times."""
    step, count = llm.engine.step, [0]

    def counted():
        count[0] += 1
        assert count[0] <= bound, f"no end after {bound} steps"
        return step()

    llm.engine.step = counted


def check_model(args: EngineArgs, options: dict, requests) -> dict:
    """Serve ``requests`` [(prompt, max_tokens, n)] greedily through LLM(**options): each sample
    refused exactly when it could never fit alone, the others equal to the unpressured outputs."""
    llm = LLM(**options)
    bound_steps(llm, step_bound(requests))
    prompts = [p for p, _, _ in requests]
    params = [SamplingParams(temperature=0, n=n, max_tokens=m, ignore_eos=True) for _, m, n in requests]
    outs = llm.generate(prompts, params, use_tqdm=False)
    want = reference_outputs(prompts)
    max_model_len = llm.max_model_len
    for i, ((prompt, max_tokens, n), out, full) in enumerate(zip(requests, outs, want)):
        assert out.finished and len(out.outputs) == n
        max_new = min(max_tokens, max_model_len - len(prompt))
        refuse = never_fits_alone(args, max_model_len, len(prompt), max_new)
        for c in out.outputs:
            if refuse:
                assert c.finish_reason == "abort" and str(c.stop_reason).startswith("refused"), (
                    f"request {i} sample {c.index} can never fit alone, yet ended {c.finish_reason!r}")
                continue
            assert c.finish_reason == "length", f"request {i} sample {c.index} ended {c.finish_reason!r}"
            assert c.token_ids == full[:max_new], f"request {i} sample {c.index}: not the unpressured output"
    assert_nothing_held(llm.engine.core)
    return llm.engine.stats


@st.composite
def model_cases(draw):
    """(EngineArgs options, requests [(prompt, max_tokens, n)]), all greedy and arriving at once."""
    options = draw_options(draw, "tiny", max_batched=32)
    options["max_model_len"] = MODEL_MAX_LEN
    requests = draw_requests(draw, MODEL_MAX_LEN, options["max_num_seqs"], st.integers(60, 64), max_requests=4,
                             max_prompt=16, max_tokens=MODEL_MAX_TOKENS, max_arrival=0)
    add_pool(draw, options, requests, MODEL_MAX_LEN)
    return options, [(prompt, max_tokens, n) for prompt, max_tokens, n, _, _ in requests]


@settings(max_examples=300, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(model_cases())
def test_greedy_outputs_under_pressure_equal_the_unpressured_ones(case):
    options, requests = case
    args = engine_args(MODEL_MAX_LEN, **options)
    assume(args is not None)
    stats = check_model(args, options, requests)
    event(f"preempted: {stats['preemptions'] > 0}")
    event(f"swapped: {stats['preempted_swap'] > 0}")


@pytest.mark.parametrize("name", list(GUARDS))
def test_hand_picked_cases_on_the_model(name):
    options, requests, stat = GUARDS[name]
    options = dict(options, model="tiny", max_model_len=MODEL_MAX_LEN)
    args = engine_args(MODEL_MAX_LEN, **options)
    assert args is not None, "the guard's options are meant to be valid"
    stats = check_model(args, options, [(prompt, max_tokens, n) for prompt, max_tokens, n, _, _ in requests])
    if stat is not None:
        assert stats[stat] > 0, f"{stat} never happened; the guard proves nothing: {stats}"
