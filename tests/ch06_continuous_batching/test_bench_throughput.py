"""bench throughput: the default engine against HF generate, measured side by side in one run."""

import pytest

from minipaged.lab.bench import throughput


@pytest.mark.slow
def test_bench_throughput_counts_what_each_request_produced():
    r = throughput.run("tiny", workloads=("readme",), rounds=1, hf_batch_size=4, progress=False, requests=5)
    row = r["workloads"]["readme"]
    assert row["requests"] == 5 and row["max_tokens"] == 32  # two HF batches, the second of one request
    for system in ("minipaged", "chunked", "hf"):
        s = row[system]
        assert 0 < s["output_tokens"] <= 32 * row["requests"] and s["seconds"] > 0
        assert s["output_tokens_per_s"] == pytest.approx(s["output_tokens"] / s["seconds"])
    assert row["speedup"] == pytest.approx(row["minipaged"]["output_tokens_per_s"] / row["hf"]["output_tokens_per_s"])
    assert row["chunked_identical"], "chunked prefill must not change the greedy tokens"
    assert "readme" in throughput.format_result(r) and "x   identical greedy outputs" in throughput.format_result(r)


def test_bad_workload_and_rounds_are_refused():
    with pytest.raises(ValueError, match="workload"):
        throughput.run("tiny", workloads=("nope",))
    with pytest.raises(ValueError, match="rounds"):
        throughput.run("tiny", rounds=0)
    with pytest.raises(ValueError, match="requests"):
        throughput.run("tiny", requests=0)
