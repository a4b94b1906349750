"""The kernels serve the model: the tiny model generates the same tokens with either backend."""

import pytest

from minipaged import LLM, SamplingParams

PROMPTS = ["Hello there", [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]  # 2nd: > 1 block


@pytest.mark.parametrize("kv_policy", ["on_demand"])
def test_tiny_model_same_tokens_with_numba_kernels(numba_cuda, kv_policy):
    params = SamplingParams(temperature=0.0, max_tokens=6)
    tokens = {}
    for backend in ("torch", "numba"):
        llm = LLM("tiny", kv_policy=kv_policy, attention_backend=backend, progress=False)
        tokens[backend] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert tokens["numba"] == tokens["torch"]
    assert all(len(t) == 6 for t in tokens["torch"])
