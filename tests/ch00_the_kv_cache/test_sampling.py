"""Chapter 00: the sampling rules, checked against straightforward computations in the test."""

import pytest
import torch

from minipaged.sampling import make_generator, processed_logits, sample_seed, sample_token
from minipaged.sampling_params import SamplingParams


def kept(logits, **kw):
    return set(torch.nonzero(torch.isfinite(processed_logits(logits, SamplingParams(**kw)))).flatten().tolist())


def test_greedy_is_argmax():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert sample_token(logits, SamplingParams(temperature=0), make_generator(0)) == int(logits.argmax())


def test_top_k_keeps_the_k_largest():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    assert kept(logits, top_k=5) == set(torch.topk(logits, 5).indices.tolist())


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = probs.log()
    assert kept(logits, top_p=0.5) == {0}
    assert kept(logits, top_p=0.6) == {0, 1}
    assert kept(logits, top_p=0.86) == {0, 1, 2, 3}
    assert kept(logits, top_p=1.0) == {0, 1, 2, 3, 4}


def test_min_p_drops_unlikely_tokens():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert kept(logits, min_p=0.2) == {0, 1, 2}


def test_samples_follow_softmax_of_logits_over_temperature():
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    params = SamplingParams(temperature=0.7)
    g = make_generator(123)
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sample_token(logits, params, g)] += 1
    expected = torch.softmax(logits / 0.7, -1)
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03)


def test_per_sample_seeds():
    assert sample_seed(None, 3) is None
    assert sample_seed(5, 0) == 5
    assert len({sample_seed(5, i) for i in range(100)}) == 100


@pytest.mark.parametrize("seed", [0, 1, 99])
def test_seeded_generators_repeat(seed):
    logits = torch.randn(30, generator=torch.Generator().manual_seed(2))
    p = SamplingParams(temperature=1.0)
    a = [sample_token(logits, p, g) for g in [make_generator(seed)] for _ in range(20)]
    b = [sample_token(logits, p, g) for g in [make_generator(seed)] for _ in range(20)]
    assert a == b
