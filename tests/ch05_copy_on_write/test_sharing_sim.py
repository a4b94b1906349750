"""Memory saved by sharing, simulated with the real "shared" policy; the command and the figures."""

import json

import pytest

from minipaged.kv import SharedPolicy, make_policy
from minipaged.lab.simulator import Request, make_workload, simulate
from minipaged.lab.simulator.cli import main
from minipaged.lab.simulator.sharing import PAPER_SAVED, simulate_beam, simulate_parallel, simulate_sharing


@pytest.fixture(scope="module")
def alpaca():
    return make_workload("alpaca", 60, arrival_rate=1.0, seed=0)


def test_parallel_sampling_by_hand():
    """One 20-token prompt, blocks of 16, two samples of 4 tokens each. Step 1 prefills the prompt
    once: [full block, 4-token block], 2 blocks, nothing shared yet; the second sample is forked from
    it after the step. In step 2 each sample writes its first token: the first write copies the
    4-token block. From then on each step holds 3 distinct blocks where unshared sequences would
    hold 4: over 4 steps, 2 + 3 + 3 + 3 = 11 blocks against 14, 3/14 saved."""
    request = Request(0, 0, prompt_len=20, output_len=4, max_tokens=4)
    result = simulate_parallel(SharedPolicy(160, block_size=16, max_model_len=64), [request], n=2)
    assert (result.steps, result.physical, result.logical) == (4, [2, 3, 3, 3], [2, 4, 4, 4])
    assert result.saved_fraction == 1 - 11 / 14 and result.forks == 1 and result.cow_copies == 1
    assert result.finished == 2


def test_one_sample_or_one_beam_shares_nothing(alpaca):
    for mode in ("parallel", "beam"):
        result = simulate_sharing(mode, alpaca, 1, capacity=8192, max_model_len=512)
        assert result.saved_fraction == 0 and result.forks == 0


def test_sharing_saves_memory_and_beams_save_more(alpaca):
    rows = {(mode, n): simulate_sharing(mode, alpaca, n, capacity=8192, max_model_len=512)
            for mode in ("parallel", "beam") for n in (2, 4)}
    assert all(r.finished and not r.refused for r in rows.values())
    assert 0 < rows["parallel", 2].saved_fraction < rows["parallel", 4].saved_fraction < 0.5
    assert rows["parallel", 4].saved_fraction < rows["beam", 2].saved_fraction < rows["beam", 4].saved_fraction
    assert rows["beam", 2].saved_fraction < 1 - 1 / 2 and rows["beam", 4].saved_fraction < 1 - 1 / 4
    assert rows["parallel", 2].forks == len(alpaca) * 1 + rows["parallel", 2].preemptions  # restarts fork again
    assert rows["beam", 4].cow_copies > 0


def test_a_small_pool_preempts_restarts_and_leaks_nothing(alpaca):
    for run, n in ((simulate_parallel, 4), (simulate_beam, 4)):
        policy = SharedPolicy(1024, block_size=16, max_model_len=512)
        result = run(policy, alpaca[:30], n)
        assert result.preemptions > 0 and result.finished
        policy.check_invariants()
        assert policy.seq_ids() == [] and policy.num_free_blocks == policy.num_blocks


def test_shared_on_a_plain_trace_is_on_demand(alpaca):
    """Without forks the shared policy takes exactly the blocks on_demand takes."""
    a = simulate(make_policy("shared", num_slots=2048, max_model_len=512), alpaca)
    b = simulate(make_policy("on_demand", num_slots=2048, max_model_len=512), alpaca)
    assert a.summary() | {"policy": "x"} == b.summary() | {"policy": "x"}


def test_bad_input(alpaca):
    with pytest.raises(ValueError, match="mode"):
        simulate_sharing("fork", alpaca, 2)
    with pytest.raises(ValueError, match="n must"):
        simulate_sharing("beam", alpaca, 0)


def test_the_sharing_command(capsys, tmp_path):
    assert main(["--sharing", "--workload", "alpaca", "--num-requests", "40", "--samples", "2",
                 "--beam-widths", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["workload"], r["mode"], r["n"]) for r in out["sharing"]] == [("alpaca", "parallel", 2),
                                                                             ("alpaca", "beam", 2)]
    assert all(0 < r["saved"] < 1 for r in out["sharing"]) and out["config"]["num_requests"] == 40
    assert out["paper_saved"] == {w: {k: list(v) for k, v in r.items()} for w, r in PAPER_SAVED.items()}
    assert main(["--sharing", "--num-requests", "20", "--samples", "2", "--beam-widths", "2",
                 "--plot-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "sharegpt" in text and "alpaca" in text and "quoted, not measured here" in text
    assert (tmp_path / "memory_saved.png").stat().st_size > 1000


def test_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from minipaged.lab.plots import plot_block_sharing, plot_blocks_over_time, plot_memory_saved

    p = SharedPolicy(32, block_size=4, max_model_len=16, watermark=0)
    p.allocate("A", 6, 4)
    p.append_slots("A", 6)
    p.fork("A", "B")
    before = p.snapshot()
    p.append_slots("B", 1)
    fig = plot_block_sharing([before, p.snapshot()], ["fork", "copy on write"], path=tmp_path / "s.png")
    assert (tmp_path / "s.png").exists() and len(fig.axes) == 2
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "ref 2" in texts and "copy K,V" in [t.get_text() for t in fig.axes[1].texts]
    plot_blocks_over_time([1, 2, 2], [2, 4, 4], path=tmp_path / "t.png")
    rows = [{"workload": "alpaca", "mode": m, "n": n, "saved": 0.1 * n} for m in ("parallel", "beam") for n in (2, 4)]
    plot_memory_saved(rows, path=tmp_path / "m.png")
    assert (tmp_path / "t.png").exists() and (tmp_path / "m.png").exists()
    rows += [{**r, "workload": "sharegpt"} for r in rows]
    fig = plot_memory_saved(rows, paper=PAPER_SAVED)
    ranges = [(p.get_y(), p.get_y() + p.get_height()) for p in fig.axes[0].patches if p.get_hatch()]
    # one hatched range per bar, each the paper's range for that bar's own trace
    assert len(ranges) == 8
    assert ranges.count(pytest.approx((6.1, 9.8))) == 2 and ranges.count(pytest.approx((16.2, 30.5))) == 2
    assert ranges.count(pytest.approx((37.6, 55.2))) == 2 and ranges.count(pytest.approx((44.3, 66.3))) == 2
    with pytest.raises(ValueError, match="snapshots"):
        plot_block_sharing([])
    with pytest.raises(ValueError, match="same length"):
        plot_blocks_over_time([1], [1, 2])
