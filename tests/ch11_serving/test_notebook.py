"""The chapter's notebook: its hand-written event framing still matches the server's, and it runs top
to bottom against a real server (SmolLM2), with the results the chapter describes."""

import json
import random
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "11_serving.ipynb"


@pytest.mark.parametrize("seed", range(4))
def test_notebook_sse_framing_matches_the_server(rederive, seed):
    pytest.importorskip("fastapi")
    from minipaged.server.api import sse

    by_hand = rederive(NOTEBOOK, json=json)["sse_by_hand"]
    rng = random.Random(seed)
    chunk = {"id": f"cmpl-{seed}", "object": "text_completion", "created": rng.randrange(10**9),
             "choices": [{"index": rng.randrange(4), "text": "".join(rng.choice("ab \n\"é") for _ in range(8)),
                          "finish_reason": rng.choice([None, "stop", "length"])}]}
    assert by_hand(chunk) == sse(chunk)
    assert by_hand("[DONE]") == sse("[DONE]") == b"data: [DONE]\n\n"
    assert json.loads(by_hand(chunk).decode().removeprefix("data: ")) == chunk


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(run_notebook):
    pytest.importorskip("openai")
    text = run_notebook(NOTEBOOK)
    assert "models: ['smollm2-135m']" in text
    assert "same answer offline: True" in text
    assert "framing as by hand: True" in text
    assert "joined deltas equal the whole answer: True" in text
    assert "finish_reason chunks: [" in text
    assert "400 invalid_request_error | param: top_p" in text
    assert "message: SamplingParams.top_p=2.0 is not allowed" in text
    assert 'minipaged:num_requests_running{model_name="smollm2-135m"}' in text
    assert "block table: [" in text
    assert "prompt tokens this request found in the prefix cache: 16" in text
    assert "running after the hang-up: 0" in text
    assert "KV usage after the hang-up: 0.0" in text
    assert "aborted requests: 1" in text
    assert "exit code: 0" in text
    assert "every KV block is back in the pool" in text
