"""Beam search with beams that share blocks, against a plain beam search without any sharing.

Three oracles:
    * a naive beam search written here, over a toy "model" whose log-probabilities are a fixed
      function of the token history. The shared search reads that history back through its block
      tables from a paged memory (copies on write included), so any sharing bug changes the result;
    * the per-request engine: every beam keeps private K/V tensors, cloned in full when beams
      branch (``LLM(kv_policy="per_request").beam_search``). It runs one request at a time; given
      one prompt at a time, the shared search batches its beams exactly as it does, so the two
      compute the same floating-point numbers: equal, not close. Several prompts at once, the shared
      search batches them together, which changes only the rounding;
    * greedy decoding, which beam width 1 must reproduce (with ignore_eos).
"""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged import LLM, SamplingParams
from minipaged.beam_search import BeamSearchOutput, BeamSearchParams, beam_score, worst_case_blocks
from minipaged.config import EngineArgs
from minipaged.core import EngineCore
from minipaged.kv import SharedPolicy
from minipaged.lab.simulator.runner import SyntheticRunner
from minipaged.metrics_reader import find
from minipaged.sampling import step_outputs
from minipaged.step import RunnerOutput, Sampled

TOY_VOCAB, TOY_EOS = 9, 0


def toy_logprobs(tokens: list[int]) -> list[tuple[int, float]]:
    """A fixed next-token distribution for each history, best first."""
    rng = random.Random(str(tokens))
    logits = [rng.gauss(0, 2) for _ in range(TOY_VOCAB)]
    top = max(logits)
    log_z = top + math.log(sum(math.exp(x - top) for x in logits))
    return sorted(((t, x - log_z) for t, x in enumerate(logits)), key=lambda c: -c[1])


def naive_beam_search(prompt, width, max_tokens, ignore_eos, length_penalty):
    def score(tokens, cum):
        return beam_score(tokens, cum, TOY_EOS, length_penalty)

    beams, complete = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        candidates = []
        for tokens, cum in beams:
            for token, logprob in toy_logprobs(tokens)[:2 * width]:
                child = (tokens + [token], cum + logprob)
                (complete if token == TOY_EOS and not ignore_eos else candidates).append(child)
        candidates.sort(key=lambda c: score(*c), reverse=True)
        beams = candidates[:width]
        if not beams:
            break
    return sorted(complete + beams, key=lambda c: score(*c), reverse=True)[:width]


class ToyRunner(SyntheticRunner):
    """A runner for the engine core over a "shared" policy whose "K/V" is the token id itself, stored
    slot by slot. The toy model reads each beam's history through its block table, after the copies
    on write are made."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy  # read only: its block tables
        self.memory = {}

    def execute(self, plan):
        bs = self.policy.block_size
        for src, dst in plan.copies:
            for offset in range(bs):
                self.memory[dst * bs + offset] = self.memory.get(src * bs + offset)
        for work in plan.work:
            for slot in work.slots:
                assert self.policy.ref_count(slot // bs) == 1, "a write into a shared block"
            self.memory.update(zip(work.slots, work.tokens))
        self.policy.check_invariants()
        histories = [[self.memory[s] for s in self.policy.token_slots(work.seq.seq_id)] for work in plan.work]
        return RunnerOutput(step_outputs(plan.work, lambda i, j, seq, before: Sampled(7),
                                         lambda i, work: toy_logprobs(histories[i])[:2 * work.beam_width]))


def toy_beam_search(policy, prompts, params):
    """Beam search in the engine core (its scheduler, forks, frees and preemption) over the toy model."""
    args = EngineArgs(model="toy", kv_policy="shared", block_size=policy.block_size,
                      kv_capacity_tokens=policy.num_slots, watermark=0).validate()
    core = EngineCore(args, policy, ToyRunner(policy), None, TOY_EOS, policy.max_model_len)
    requests = [core.add_beam_request(str(i), prompt, params) for i, prompt in enumerate(prompts)]
    while core.has_unfinished_requests():
        core.step()
    return [r.beam.output for r in requests]


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(1, TOY_VOCAB - 1), min_size=1, max_size=9), min_size=1, max_size=4),
       width=st.integers(1, 4), max_tokens=st.integers(1, 10), ignore_eos=st.booleans(),
       length_penalty=st.sampled_from([0.0, 1.0, 2.0]), num_blocks=st.integers(8, 40))
def test_shared_search_equals_a_naive_one(prompts, width, max_tokens, ignore_eos, length_penalty, num_blocks):
    """Random prompts and pool sizes: small pools preempt (and restart) requests; too small ones refuse."""
    policy = SharedPolicy(num_blocks * 2, block_size=2, max_model_len=32, watermark=0)
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=ignore_eos,
                              length_penalty=length_penalty)
    outputs = toy_beam_search(policy, prompts, params)
    for prompt, out in zip(prompts, outputs):
        worst = worst_case_blocks(len(prompt), max_tokens, width, 2)
        if worst > num_blocks:
            assert out.refused and out.sequences == []
            continue
        expected = naive_beam_search(prompt, width, max_tokens, ignore_eos, length_penalty)
        assert [(s.tokens, s.cum_logprob) for s in out.sequences] == expected
        assert all(s.finish_reason == ("stop" if s.tokens[-1] == TOY_EOS and not ignore_eos else "length")
                   for s in out.sequences)
    assert policy.seq_ids() == [] and policy.num_free_blocks == num_blocks and policy.pending_copies() == []


# ---- the model --------------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, list(range(30, 45))]


def beams(outs):
    return [[(s.tokens, s.cum_logprob, s.text, s.finish_reason) for s in o.sequences] for o in outs]


def one_by_one(llm, prompts, params):
    """Each prompt's beam search alone, so the shared and the private search run the same batches."""
    return [out for p in prompts for out in llm.beam_search([p], params)]


def assert_equal_up_to_rounding(got, want):
    """The same beams, texts and finish reasons; log-probabilities equal but for float rounding."""
    assert [[(s.tokens, s.text, s.finish_reason) for s in o.sequences] for o in got] == [
        [(s.tokens, s.text, s.finish_reason) for s in o.sequences] for o in want]
    assert [s.cum_logprob for o in got for s in o.sequences] == pytest.approx(
        [s.cum_logprob for o in want for s in o.sequences], rel=1e-5)


@pytest.fixture(scope="module")
def per_request():
    return LLM("tiny", kv_policy="per_request", max_model_len=256, progress=False)


@pytest.fixture(scope="module")
def shared():
    # the reference attention and the model's PyTorch code: the batched backend and the compiled kernels
    # compute the same math with other rounding, and these tests compare floats with the private beams' exactly
    return LLM("tiny", kv_policy="shared", attention_backend="torch", cpu_kernels=False, kv_capacity_tokens=4096,
               block_size=8, max_model_len=256, progress=False)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_shared_beams_equal_private_beams_exactly(per_request, shared, width):
    params = BeamSearchParams(beam_width=width, max_tokens=24)
    ref = one_by_one(per_request, PROMPTS, params)
    got = one_by_one(shared, PROMPTS, params)
    assert beams(got) == beams(ref)  # tokens, cum_logprob (==, not approx), text, finish reason
    assert all(len(o.sequences) == width for o in got)
    if width == 4:
        assert any(s.finish_reason == "stop" for o in got for s in o.sequences), "no beam ended on EOS"
    # all the prompts at once: the requests' beams batched together in the shared pool
    assert_equal_up_to_rounding(shared.beam_search(PROMPTS, params), ref)
    shared.engine.check_invariants(idle=True)


def test_beams_share_fork_copy_and_save_memory(shared):
    def copies():
        return find(shared.get_metrics(), "block_copies").value

    forks_before, copies_before = shared.engine.stats.get("forks", 0), copies()
    with shared.engine.metrics.steps.recording() as rec:
        shared.beam_search(PROMPTS, BeamSearchParams(beam_width=4, max_tokens=24))
    assert shared.engine.stats["forks"] > forks_before and copies() > copies_before
    physical, logical = sum(rec.series("blocks_physical")), sum(rec.series("blocks_logical"))
    assert physical < 0.75 * logical  # four beams hold far less than four private copies
    shared.engine.check_invariants(idle=True)


def test_width_one_is_greedy_decoding(per_request, shared):
    """One prompt at a time, so that both run the same batches and agree to the last bit."""
    params = BeamSearchParams(beam_width=1, max_tokens=20, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for prompt in PROMPTS:
        (g,) = per_request.generate(prompt, greedy, use_tqdm=False)[0].outputs
        for llm in (per_request, shared):
            (best,) = llm.beam_search(prompt, params)[0].sequences
            assert best.tokens == prompt + g.token_ids
            assert best.cum_logprob == g.cumulative_logprob


def test_output_has_vllm_shape(shared, per_request):
    outs = shared.beam_search({"prompt_token_ids": PROMPTS[1]}, BeamSearchParams(beam_width=3, max_tokens=8))
    assert len(outs) == 1 and isinstance(outs[0], BeamSearchOutput) and outs[0].refused is None
    seqs = outs[0].sequences
    eos = shared.tokenizer.eos_token_id
    scores = [beam_score(s.tokens, s.cum_logprob, eos, 1.0) for s in seqs]
    assert scores == sorted(scores, reverse=True)
    for s in seqs:
        assert s.tokens[:len(PROMPTS[1])] == PROMPTS[1]  # tokens include the prompt
        generated = s.tokens[len(PROMPTS[1]):]
        assert s.text == shared.tokenizer.decode(generated[:-1] if s.finish_reason == "stop" else generated)
        assert s.cum_logprob == pytest.approx(sum(s.logprobs)) and len(s.logprobs) == len(generated)
    text = shared.beam_search("hello", BeamSearchParams(beam_width=2, max_tokens=4))
    assert text[0].sequences[0].tokens[:5] == shared.tokenizer.encode("hello")


def test_a_small_pool_restarts_requests_and_leaks_nothing(shared):
    small = LLM("tiny", kv_policy="shared", kv_capacity_tokens=96, block_size=4, max_model_len=96, progress=False)
    params = BeamSearchParams(beam_width=3, max_tokens=16, ignore_eos=True)
    got = small.beam_search(PROMPTS[:3], params)
    assert small.engine.stats["preemptions"] > 0, "the pool was meant to run dry; the test proves nothing"
    # a restarted request is recomputed in other batches, so compare what does not depend on float noise
    ref = shared.beam_search(PROMPTS[:3], params)
    assert [[s.tokens for s in o.sequences] for o in got] == [[s.tokens for s in o.sequences] for o in ref]
    small.engine.check_invariants(idle=True)


def test_a_request_that_can_never_fit_is_refused_and_the_rest_served(shared):
    # 32 blocks of 8: four beams of 3 + 60 tokens may need all 32; 59 + 60 tokens may need 39
    llm = LLM("tiny", kv_policy="shared", attention_backend="torch", cpu_kernels=False, kv_capacity_tokens=256,
              block_size=8, max_model_len=256, progress=False)
    params = BeamSearchParams(beam_width=4, max_tokens=60, ignore_eos=True)
    outs = llm.beam_search([list(range(1, 60)), PROMPTS[0]], params)
    assert outs[0].sequences == [] and "pool" in outs[0].refused
    assert beams(outs[1:]) == beams(shared.beam_search([PROMPTS[0]], params))
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("kwargs, field", [
    (dict(beam_width=0, max_tokens=4), "beam_width"), (dict(beam_width=2, max_tokens=0), "max_tokens"),
    (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature"),
    (dict(beam_width=2, max_tokens=4, length_penalty="long"), "length_penalty"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_policies_that_cannot_fork_are_refused_clearly(shared):
    with pytest.raises(ValueError, match="kv_policy='shared'"):
        LLM("tiny", kv_policy="on_demand", progress=False).beam_search([[1, 2]], BeamSearchParams(2, 4))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        shared.beam_search([[1, 2]], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        shared.beam_search([], BeamSearchParams(2, 4))


@pytest.mark.slow
def test_real_model_shared_beams_equal_private_beams(real_llm):
    tok = real_llm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Name a fruit that is yellow.")]
    params = BeamSearchParams(beam_width=3, max_tokens=16)
    llm = LLM("smollm2-135m", kv_policy="shared", attention_backend="torch", cpu_kernels=False,
              kv_capacity_tokens=4096, max_model_len=512, progress=False)
    per_request = LLM("smollm2-135m", kv_policy="per_request", max_model_len=512, progress=False)
    with llm.engine.metrics.steps.recording() as rec:
        got = one_by_one(llm, prompts, params)
    ref = one_by_one(per_request, prompts, params)
    assert beams(got) == beams(ref)
    assert_equal_up_to_rounding(llm.beam_search(prompts, params), ref)  # both prompts batched together
    assert "Paris" in got[0].sequences[0].text
    assert llm.engine.stats["forks"] > 0 and sum(rec.series("blocks_physical")) < sum(rec.series("blocks_logical"))
    llm.engine.check_invariants(idle=True)
