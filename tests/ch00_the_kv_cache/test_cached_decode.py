"""Chapter 00: decoding with the KV cache computes exactly what full recomputation computes."""

import pytest
import torch

from minipaged.engine import NaiveEngine
from minipaged.kv.per_request import BatchOfCaches, NoCache, PerRequestKVCache
from minipaged.model import load_model
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams


def greedy(engine, prompt_ids, max_tokens):
    cfg = engine.model.config
    seq = Sequence(0, prompt_ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                   cfg.eos_token_id, cfg.max_model_len)
    return engine.run_sequence(seq).output_ids


@pytest.mark.parametrize("prompt", [[1], [5, 17, 200], list(range(40, 90))])
def test_cached_equals_recompute_tiny(prompt):
    loaded = load_model("tiny")
    cached = greedy(NaiveEngine(loaded.model, loaded.tokenizer, use_cache=True), prompt, 48)
    recomputed = greedy(NaiveEngine(loaded.model, loaded.tokenizer, use_cache=False), prompt, 48)
    assert cached == recomputed
    assert len(set(cached)) > 5, "the tiny model should produce varied tokens, or this test proves little"


def test_cached_logits_match_recompute_step_by_step():
    """Not only the argmax: every decode step's logits agree with recomputing the whole sequence."""
    model = load_model("tiny").model
    ids = [3, 141, 59, 26, 53, 58]
    cache = PerRequestKVCache(model.config.num_layers)
    logits = model(torch.tensor(ids), torch.arange(len(ids)), cache)[-1]
    for _ in range(20):
        ids.append(int(logits.argmax()))
        logits = model(torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1]), cache)[-1]
        full = model(torch.tensor(ids), torch.arange(len(ids)), NoCache())[-1]
        torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)
    assert cache.num_tokens == len(ids)


def test_cache_size_is_bytes_per_token_times_tokens():
    loaded = load_model("tiny")
    cfg = loaded.config
    cache = PerRequestKVCache(cfg.num_layers)
    loaded.model(torch.arange(10), torch.arange(10), cache)
    assert cache.num_tokens == 10
    assert cache.nbytes() == 10 * cfg.kv_bytes_per_token(4)


def test_batch_of_caches_equals_one_at_a_time():
    model = load_model("tiny").model
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11], [42]]
    alone = [model(torch.tensor(p), torch.arange(len(p)), PerRequestKVCache(2), logits_rows=[-1])[0]
             for p in prompts]
    caches = [PerRequestKVCache(2) for _ in prompts]
    flat = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    last_rows = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    together = model(flat, positions, BatchOfCaches(caches, [len(p) for p in prompts]), logits_rows=last_rows)
    for a, b in zip(alone, together):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_cached_equals_recompute_real_model(real_llm):
    tok = real_llm.tokenizer
    ids = tok.encode("The capital of France is")
    cached = greedy(NaiveEngine(real_llm.model, tok, use_cache=True), ids, 16)
    recomputed = greedy(NaiveEngine(real_llm.model, tok, use_cache=False), ids, 16)
    assert cached == recomputed
