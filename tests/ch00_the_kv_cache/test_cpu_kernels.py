"""The compiled CPU kernels (minipaged/csrc/cpu_ops.cpp, model/kernels.py) against the PyTorch code
they replace, which stays in model/llama.py as their oracle: each operation alone, a whole forward
pass, and the engine's greedy tokens. Then what happens when the kernels cannot be built."""

import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from minipaged import LLM, SamplingParams
from minipaged.model import kernels, kernels_build
from minipaged.model.config import SMOLLM2_135M, TINY
from minipaged.model.llama import MLP, Linear, RMSNorm, Rotary
from minipaged.model.random import random_model

# where there is a compiler the kernels must build (a build error fails here, it is not skipped)
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                reason="no C++ compiler on this machine: the kernels cannot be built")
ops = kernels.ops() if shutil.which(os.environ.get("CXX", "c++")) else None


def test_the_kernels_build():
    assert ops is not None, "the CPU kernels did not build: see the warning above for the compiler's error"


def both(fn):
    """fn() through the PyTorch code, then through the kernels."""
    want = fn()
    with kernels.enabled():
        got = fn()
    return want, got


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_rms_norm(rows):
    norm = RMSNorm(576, 1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(rows, 576) * 3
    want, got = both(lambda: norm(x))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_rotary_on_a_strided_slice_of_qkv(head_dim):
    rotary = Rotary(head_dim, 10000.0)
    cos, sin = rotary.angles(torch.tensor([0, 7, 300, 4095]))
    qkv = torch.randn(4, 9 + 2 * 3, head_dim)
    x = qkv[:, :12]  # q and k, as the model rotates them: rows 15 heads apart
    want, got = both(lambda: Rotary.rotate(x, cos, sin))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (4, 12, head_dim)


def test_silu_and_mul():
    mlp = MLP(TINY)
    x = torch.randn(6, TINY.hidden_size)
    want, got = both(lambda: mlp(x))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(3, 20) * 30  # large negative gates: silu goes to -0, not NaN
    gate, up = gate_up.split(10, dim=-1)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 32, Linear.PACKED_ROWS, Linear.PACKED_ROWS + 1])
# (out, in): whole panels, a part panel, less than one panel, inputs past one chunk of 128 sums, both
@pytest.mark.parametrize("shape", [(960, 576), (83, 64), (7, 12), (48, 300), (83, 300)])
def test_linear_at_every_row_count(rows, shape):
    layer = Linear(shape[1], shape[0])
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(rows, shape[1])
    want, got = both(lambda: layer(x))
    torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_packed_weight_is_w_in_panels_and_follows_the_weight():
    layer = Linear(5, 20)
    w = layer.weight.detach()
    packed = layer.packed()
    assert packed.shape == (2, 5, 16)
    for p, k, c in [(0, 0, 0), (0, 4, 15), (1, 2, 3)]:
        assert packed[p, k, c] == w[16 * p + c, k]
    assert torch.equal(packed[1, :, 4:], torch.zeros(5, 12))  # past the last row of W
    assert layer.packed() is packed  # kept
    with torch.no_grad():
        layer.weight[3, 1] = 7.0  # an in-place edit: packed again
    assert layer.packed()[0, 1, 3] == 7.0
    layer.weight = torch.nn.Parameter(torch.ones(20, 5))  # another tensor: packed again
    assert torch.equal(layer.packed()[0], torch.ones(5, 16))
    with pytest.raises(RuntimeError, match="must agree"):
        ops.packed_linear(torch.randn(3, 6), packed, 20)  # in = 6 against panels of 5
    with pytest.raises(RuntimeError, match="must agree"):
        ops.packed_linear(torch.randn(5), packed, 20)  # x is not [T, in]


def test_write_kv_stores_rows_in_their_slots_and_checks_them():
    k_cache, v_cache = torch.zeros(4, 2, 3, 8), torch.zeros(4, 2, 3, 8)
    k, v = torch.randn(3, 3, 8), torch.randn(3, 3, 8)
    slots = torch.tensor([5, 0, 6])
    ops.write_kv(k, v, k_cache, v_cache, slots)
    want_k, want_v = torch.zeros(8, 3, 8), torch.zeros(8, 3, 8)
    want_k.index_copy_(0, slots, k)
    want_v.index_copy_(0, slots, v)
    assert torch.equal(k_cache.view(8, 3, 8), want_k) and torch.equal(v_cache.view(8, 3, 8), want_v)
    with pytest.raises(RuntimeError, match="slot out of range"):
        ops.write_kv(k, v, k_cache, v_cache, torch.tensor([1, 8, 2]))


@pytest.mark.parametrize("cfg", [TINY, SMOLLM2_135M], ids=["tiny", "smollm2-shapes"])
def test_a_whole_forward_pass_gives_the_same_logits(cfg):
    """Prefill then decodes through a paged cache, with the model's real shapes (random weights)."""
    from minipaged.attention import step_attention
    from minipaged.runner import PagedBatch, PagedKVCache

    model = random_model(cfg if cfg is TINY else cfg.__class__(**{**cfg.__dict__, "num_layers": 3}))
    logits = {}
    for on in (False, True):
        cache = PagedKVCache(model.config, num_blocks=8, block_size=4)
        prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2])
        with kernels.enabled(on):
            attention = step_attention("cpu" if on else "torch")  # the kernel against the reference
            batch = PagedBatch(cache, list(range(7)), [[0, 1]], [7], [7], attention)
            first = model(prompt, torch.arange(7), batch, logits_rows=torch.tensor([6]))
            batch = PagedBatch(cache, [7], [[0, 1]], [8], [1], attention)
            second = model(torch.tensor([6]), torch.tensor([7]), batch)
        logits[on] = torch.cat([first, second])
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)


def test_engine_tokens_are_the_same_with_and_without_kernels():
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, list(range(30, 70))]
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outs = {}
    for on in (False, True):
        llm = LLM("tiny", cpu_kernels=on, attention_backend="cpu" if on else "torch", kv_capacity_tokens=96,
                  block_size=4, max_model_len=96, progress=False)
        outs[on] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert outs[True] == outs[False]


def test_the_kernels_run_only_inside_enabled_and_only_for_float32():
    x = torch.randn(2, 8)
    assert not kernels.use(x)
    with kernels.enabled():
        assert kernels.use(x) and not kernels.use(x.double()) and not kernels.use(x.bfloat16())
        with kernels.enabled(False):
            assert not kernels.use(x)
        assert kernels.use(x)
    assert not kernels.use(x)


def test_without_a_compiler_the_pytorch_code_runs(monkeypatch, tmp_path):
    """A build that fails warns once, names what to install, and leaves the model on its PyTorch code;
    the engine's tokens are unchanged."""
    broken = tmp_path / "cpu_ops.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels_build, "SOURCE", broken)
    monkeypatch.setattr(kernels_build, "_registered", lambda: False)  # as in a process that has not loaded them
    kernels.ops.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=r"not available.*apt-get install g\+\+.*pip install ninja"):
            assert kernels.ops() is None
        with kernels.enabled():
            assert not kernels.use(torch.randn(2, 8))
        greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        llm = LLM("tiny", progress=False)  # the default: cpu_kernels=True, attention_backend="cpu"
        got = [o.outputs[0].token_ids for o in llm.generate([[1, 2, 3], [5] * 9], greedy, use_tqdm=False)]
    finally:
        kernels.ops.cache_clear()
    want = [o.outputs[0].token_ids for o in LLM("tiny", cpu_kernels=False, attention_backend="torch", progress=False)
            .generate([[1, 2, 3], [5] * 9], greedy, use_tqdm=False)]
    assert got == want


def test_a_later_process_loads_the_built_library_without_compiling():
    """Once built, a new process (a test worker, a student's copy of the repository) loads the library
    as it is: no compiler, no build step, nothing printed."""
    import subprocess
    import sys

    assert ops is not None
    code = ("import sys; from minipaged.model import kernels; assert kernels.ops() is not None; "
            "assert 'torch.utils.cpp_extension' not in sys.modules, 'went through the build step'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "compiling" not in done.stderr


def test_the_engine_lays_out_its_weights_before_it_sizes_the_pool():
    # the packed copy takes memory: made when the engine is built, so the pool check sees it
    model = LLM("tiny", progress=False).llm_engine.core.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(getattr(m, "_packed", None) is not None for m in linears)
    assert all(getattr(m, "_packed", None) is None
               for m in LLM("tiny", progress=False, cpu_kernels=False).llm_engine.core.runner.model.modules()
               if isinstance(m, Linear))
