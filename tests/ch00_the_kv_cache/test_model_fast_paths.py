"""Chapter 00: the model's speed tricks against the plain math they replace (docs/pages/speed.md)."""

import pytest
import torch
import torch.nn.functional as F

from minipaged.model.config import TINY
from minipaged.model.llama import Linear, Rotary
from minipaged.model.random import random_model


@pytest.fixture
def threads():
    """Run with a given number of intra-op threads, restored afterwards (the blocked product uses one
    weight block per thread)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("num_threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 3, 17, Linear.SPLIT_ROWS, Linear.SPLIT_ROWS + 1])
def test_linear_equals_the_plain_product_at_every_row_count(rows, num_threads, threads):
    threads(num_threads)
    layer = Linear(48, 80)  # 80 outputs: two blocks of 40 with 2 threads; 3 threads do not divide it
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(rows, 48)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


def test_linear_follows_a_replaced_or_converted_weight(threads):
    threads(2)
    layer = Linear(16, 8)
    x = torch.randn(1, 16)
    layer(x)
    layer.weight = torch.nn.Parameter(torch.randn(8, 16))  # a new tensor, as loading assigns
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
    layer.to(torch.float64)  # same Parameter object, new storage
    x64 = x.double()
    torch.testing.assert_close(layer(x64), F.linear(x64, layer.weight))


def test_rotary_equals_a_rotation_of_complex_pairs():
    """RoPE's rotate-half form is a rotation of each pair (x_i, x_{i + Dh/2}) by position * freq_i."""
    head_dim, theta = 16, 10000.0
    rope = Rotary(head_dim, theta)
    positions = torch.tensor([0, 1, 5, 100, 2047])
    x = torch.randn(len(positions), 3, head_dim, dtype=torch.float64).float()
    cos, sin = rope.angles(positions)
    got = Rotary.rotate(x, cos, sin)
    half = head_dim // 2
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())  # [T, heads, Dh/2]
    angle = positions.double()[:, None] * rope.inv_freq.double()[None, :]  # [T, Dh/2]
    turned = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    want = torch.cat((turned.real, turned.imag), dim=-1).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_one_row_and_many_rows_give_the_same_logits():
    """The same tokens through the model one row at a time (blocked products) and all at once (plain
    products, past Linear.SPLIT_ROWS) agree to rounding."""
    from minipaged.kv.per_request import NoCache

    model = random_model(TINY, seed=3)
    n = Linear.SPLIT_ROWS + 3
    ids = torch.randint(0, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    together = model(ids, torch.arange(n), NoCache())  # [n, V]
    last = model(ids[:1], torch.arange(1), NoCache())  # one row: the blocked path
    torch.testing.assert_close(last[0], together[0], rtol=1e-4, atol=1e-4)


def test_step_rows_equal_one_row_at_a_time():
    from minipaged.sampling import step_rows

    logits = torch.randn(6, 300)
    logits[2, 17] = logits[2, 40] = logits[2].max() + 1  # a tie: the first index wins, as argmax says
    for row, got in zip(logits, step_rows(logits)):
        assert got.greedy_token == int(torch.argmax(row))
        torch.testing.assert_close(got.logprobs, torch.log_softmax(row, dim=-1))
        assert got.logits is not None and torch.equal(got.logits, row)
    assert step_rows(logits)[2].greedy_token == 17
