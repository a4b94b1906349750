"""Chapter 09's benchmark on the tiny model (the real-model figures come from the command)."""

import pytest

from minipaged.lab.bench import speculative as bench


def test_bench_speculative_on_the_tiny_model(tmp_path):
    r = bench.run("tiny", ks=(2, 4), max_tokens=12, progress=False, plot_dir=str(tmp_path), repeats=2)
    assert r["identical_outputs"]
    for mode in ("one at a time", "batched"):
        for kind in ("copy", "open"):
            by_k = r["modes"][mode][kind]
            assert set(by_k) == {0, 2, 4}
            assert by_k[0]["acceptance"] is None and by_k[0]["tokens_per_step"] == 1.0
            assert by_k[0]["output_tokens"] == by_k[2]["output_tokens"] == by_k[4]["output_tokens"]
            # a pass emits at most k + 1 tokens per request, and a speculating run never needs more passes
            assert by_k[4]["passes"] <= by_k[0]["passes"]
    one = r["modes"]["one at a time"]["copy"]
    assert one[0]["passes"] == one[0]["output_tokens"], "without speculation: one token per pass"
    assert one[4]["output_tokens"] <= one[4]["passes"] * 5
    assert sorted(r["pass_cost_s"]) == [1, 2, 3, 4, 5] and all(s > 0 for s in r["pass_cost_s"].values())
    text = bench.format_result(r)
    assert "identical outputs, token for token, with and without speculation: yes" in text
    assert (tmp_path / "spec_speedup.png").stat().st_size > 10_000


def test_bench_speculative_refuses_bad_k():
    with pytest.raises(ValueError, match="ks="):
        bench.run("tiny", ks=(0,))
