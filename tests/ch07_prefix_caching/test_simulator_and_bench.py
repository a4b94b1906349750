"""Chapter 07's measurements on small inputs: the model-free simulation (``simulate --prefix``) and the
benchmark (``bench prefix``) on the tiny model. The real-model figures come from the commands."""

import json

import pytest

from minipaged.cli import main
from minipaged.kv import make_policy
from minipaged.lab.bench import prefix as bench
from minipaged.lab.simulator.prefix import ideal_hit_rate, make_prefix_workload, simulate_prefix_caching
from minipaged.lab.simulator.serving import simulate_serving
from minipaged.lab.simulator.workloads import Request

TRACE = make_prefix_workload(60, num_prefixes=3, prefix_len=64, suffix_len=(2, 10), output_len=(4, 12), seed=1)


def test_the_trace_is_seeded_and_shares_prefixes():
    again = make_prefix_workload(60, num_prefixes=3, prefix_len=64, suffix_len=(2, 10), output_len=(4, 12), seed=1)
    assert again == TRACE
    assert len({r.prompt_ids[:64] for r in TRACE}) == 3
    assert all(66 <= r.prompt_len <= 74 and r.prompt_len == len(r.prompt_ids) for r in TRACE)
    with pytest.raises(ValueError, match="num_prefixes"):
        make_prefix_workload(10, num_prefixes=0)


def test_the_ideal_hit_rate_by_hand():
    a, b = tuple(range(40)), tuple(range(32)) + (99,) * 9  # b shares a's first two 16-token blocks
    reqs = [Request(0, 0, 40, 1, 1, prompt_ids=a), Request(1, 0, 41, 1, 1, prompt_ids=b),
            Request(2, 0, 40, 1, 1, prompt_ids=a)]
    assert ideal_hit_rate(reqs, 16) == (32 + 32) / (40 + 41 + 40)


def test_with_room_for_everything_the_cache_is_ideal_and_nothing_is_evicted():
    row = simulate_prefix_caching(TRACE, capacity=1 << 15, block_size=16, max_model_len=128)
    assert row["evictions"] == 0 and row["prefix_caching"]["preemptions"] == 0
    assert row["hit_rate"] == pytest.approx(ideal_hit_rate(TRACE, 16))
    assert row["compute_ratio"] > 2


def test_a_small_pool_evicts_and_hits_less():
    big = simulate_prefix_caching(TRACE, capacity=1 << 15, block_size=16, max_model_len=128)
    small = simulate_prefix_caching(TRACE, capacity=256, block_size=16, max_model_len=128)
    assert small["evictions"] > 0 and small["hit_rate"] < big["hit_rate"]
    assert small["prefix_caching"]["tokens_computed"] < small["shared"]["tokens_computed"]


def test_the_cache_does_not_change_what_the_scheduler_serves():
    runs = {}
    for name in ("shared", "prefix_caching"):
        policy = make_policy(name, num_slots=512, block_size=16, max_model_len=128)
        runs[name] = simulate_serving("continuous", policy, TRACE, max_num_seqs=8)
    assert sorted(runs["shared"].finish_step) == sorted(runs["prefix_caching"].finish_step) == list(range(60))
    assert not runs["prefix_caching"].refused


def test_simulate_prefix_prints_a_table_and_json(capsys):
    assert main(["simulate", "--prefix", "--num-requests", "40", "--capacities", "512", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["capacity"] for r in out["rows"]] == [512, 4096] and 0 < out["ideal_hit_rate"] < 1
    assert main(["simulate", "--prefix", "--num-requests", "40", "--capacities", "4096"]) == 0
    assert "an unbounded cache would serve" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="capacities"):
        main(["simulate", "--prefix", "--capacities", "8"])


@pytest.fixture(scope="module")
def result():
    # the tiny model's tokenizer spends about one token per character: a shorter system prompt
    return bench.run("tiny", questions=4, turns=3, max_tokens=6, kv_capacity=4096, repeats=2, progress=False,
                     system_prompt="You are the help desk of a small library. Answer briefly.")


def test_the_benchmark_computes_less_and_answers_the_same(result):
    assert result["identical_outputs"]
    batch = result["system_prompt"]
    assert batch["warm"]["computed"] < batch["cold"]["computed"] == batch["cold"]["prompt_tokens"]
    assert batch["cold"]["computed"] - batch["warm"]["computed"] >= 3 * (batch["system_prompt_tokens"] // 16) * 16
    turns = result["conversation"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert all(t["warm"]["computed"] < t["cold"]["computed"] == t["prompt_tokens"] for t in turns[1:])
    assert result["evictions"] == 0 and result["repeats"] == 2 and 0 < result["hit_rate"] < 1


def test_the_benchmark_prints(result, capsys):
    text = bench.format_result(result)
    assert "identical outputs, token for token, in every round: yes" in text and "fewer prompt tokens" in text
    with pytest.raises(ValueError, match="questions"):
        bench.run("tiny", questions=0)
    with pytest.raises(ValueError, match="repeats"):
        bench.run("tiny", repeats=0)
