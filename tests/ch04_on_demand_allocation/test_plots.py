"""The figures render from simulator results and save PNGs (matplotlib only; nothing is shown)."""

import pytest

from minipaged.kv import make_policy
from minipaged.lab.simulator import compare_policies, make_workload, simulate, sweep_block_size

pytest.importorskip("matplotlib")

from minipaged.lab.plots import plot_block_size_sweep, plot_memory_map, plot_waste_breakdown  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    return make_workload("alpaca", 80, arrival_rate=1.0, seed=0)


def test_memory_map(trace, tmp_path):
    result = simulate(make_policy("contiguous", num_slots=2048, max_model_len=512, reservation="pow2"), trace,
                      timeline_steps=50, timeline_every=2)
    assert len(result.timeline.steps) == 50 and result.timeline.steps[:2] == [0, 2]
    fig = plot_memory_map(result.timeline, path=tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 1000 and fig.axes
    with pytest.raises(ValueError, match="timeline"):
        plot_memory_map(simulate(make_policy("on_demand", num_slots=2048), trace).timeline)


def test_waste_breakdown_and_sweep(trace, tmp_path):
    results = compare_policies(trace, [("contiguous", "max"), ("on_demand", "max")], capacity=4096,
                               max_model_len=512)
    fig = plot_waste_breakdown(results, path=tmp_path / "waste.png")
    assert (tmp_path / "waste.png").exists() and len(fig.axes[0].patches) == 5 * 2  # 5 terms x 2 bars
    sweep = sweep_block_size(trace, [("on_demand", "max")], capacity=4096, max_model_len=512, block_sizes=(1, 8))
    plot_block_size_sweep(sweep, path=tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").exists()
