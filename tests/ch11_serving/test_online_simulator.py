"""Chapter 11's model-free load test (minipaged/lab/simulator/online.py): the real engine core, scheduler
and KV policy on a virtual clock that each step moves by a fitted step time. Checked against the
step-time arithmetic done by hand, against each system's rule (a static batch waits for its longest
member, a max_model_len slab caps the batch), and for the order of the knees."""

import math

import pytest

from minipaged.lab.bench.online import judge, poisson_arrivals, summarize
from minipaged.lab.bench.serving import make_trace
from minipaged.lab.simulator.online import SYSTEMS, StepTimeModel, make_core, simulate

MODEL = StepTimeModel(fixed_s=0.024, per_token_s=0.0014, per_seq_s=0.0006)
SHAPE = dict(kv_capacity=1536, max_model_len=256, max_num_seqs=64)


def test_the_fit_recovers_a_known_step_time_and_weighs_each_step_by_its_own_time():
    truth = StepTimeModel(0.020, 0.001, 0.003)
    rows = [(t, s, truth.seconds(t, s)) for t, s in [(1, 1), (4, 4), (30, 1), (64, 64), (200, 8), (16, 16)]]
    fitted = StepTimeModel.fit(rows)
    assert (fitted.fixed_s, fitted.per_token_s, fitted.per_seq_s) == pytest.approx((0.020, 0.001, 0.003), rel=1e-6)
    assert fitted.median_error < 1e-9 and fitted.steps == 6
    # noise of +-10% on every step: a relative fit keeps the small steps' fixed part near 20 ms,
    # where an ordinary least-squares fit is pulled by the largest steps
    noisy = [(t, s, y * (1.1 if i % 2 else 0.9)) for i, (t, s, y) in enumerate(rows * 3)]
    assert StepTimeModel.fit(noisy).fixed_s == pytest.approx(0.020, rel=0.15)


def test_the_steps_with_a_prompt_weigh_as_much_in_all_as_the_decode_steps():
    truth = StepTimeModel(0.025, 0.0015, 0.0003)
    # decode steps that grow less than linearly, as a CPU's do, so no line fits both kinds exactly
    decodes = [(b, b, truth.seconds(b, b) * (1.1 - 0.2 * b / 40)) for b in range(1, 41)]
    prompts = [(t, n, truth.seconds(t, n)) for t, n in [(16, 1), (64, 1), (128, 1), (256, 4), (512, 4)]]
    fitted = StepTimeModel.fit(decodes + prompts)
    # each kind counts as a whole: ten times the decode steps (a long serving run) change nothing
    for more in (StepTimeModel.fit(decodes * 10 + prompts), StepTimeModel.fit(decodes + prompts * 10)):
        assert (more.fixed_s, more.per_token_s, more.per_seq_s) == pytest.approx(
            (fitted.fixed_s, fitted.per_token_s, fitted.per_seq_s), rel=1e-6)
    assert fitted.seconds(512, 4) == pytest.approx(truth.seconds(512, 4), rel=0.05)


def test_the_fit_never_gives_a_negative_coefficient():
    rows = [(t, 1, 0.05 - 0.0001 * t) for t in (1, 50, 100, 200, 300)]  # time falling with the tokens
    fitted = StepTimeModel.fit(rows)
    assert min(fitted.fixed_s, fitted.per_token_s, fitted.per_seq_s) >= 0
    with pytest.raises(ValueError, match="at least 3"):
        StepTimeModel.fit(rows[:2])


def test_one_request_alone_takes_its_prefill_step_then_one_decode_step_per_token():
    prompt, n = list(range(1000, 1020)), 9
    (r,) = simulate("paged", [(prompt, n)], [5.0], MODEL, drain=60.0, **SHAPE)
    prefill, decode = MODEL.seconds(len(prompt), 1), MODEL.seconds(1, 1)
    assert r["status"] == "ok" and r["output_tokens"] == n
    assert r["chunk_s"][0] - r["arrival_s"] == pytest.approx(prefill)  # the virtual clock idled until 5.0
    assert r["end_s"] - r["arrival_s"] == pytest.approx(prefill + (n - 1) * decode)
    assert [b - a for a, b in zip(r["chunk_s"], r["chunk_s"][1:])] == pytest.approx([decode] * (n - 1))


def test_a_static_batch_makes_a_late_request_wait_for_its_longest_member():
    trace = [(list(range(1000, 1010)), 40), (list(range(2000, 2010)), 3), (list(range(3000, 3010)), 3)]
    arrivals = [0.0, 0.0, 0.01]  # the third arrives while the first two are being served
    static = simulate("static", trace, arrivals, MODEL, drain=60.0, **SHAPE)
    orca = simulate("orca_max", trace, arrivals, MODEL, drain=60.0, **SHAPE)
    assert static[2]["chunk_s"][0] > static[0]["end_s"]  # the batch ran until its 40-token member ended
    assert orca[2]["chunk_s"][0] < orca[0]["end_s"]  # continuous batching let it join at the next step
    assert all(r["status"] == "ok" for r in static + orca)


@pytest.mark.parametrize("system, most", [("static", 6), ("orca_max", 6), ("orca_pow2", None), ("paged", None)])
def test_the_kv_capacity_caps_how_many_run_at_once(system, most):
    core = make_core(system, MODEL, **SHAPE)
    from minipaged.sampling_params import SamplingParams

    for i, (prompt, n) in enumerate(make_trace(40, 0.1, 256, 49152, seed=3)):
        core.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), 0.0)
    core.step()
    running = len(core.scheduler.running)
    if most is not None:
        assert running == most  # six slabs of 256 in 1,536 slots
    else:
        assert running > 6  # smaller reservations, or blocks as tokens arrive, fit more


def test_a_capped_run_counts_only_what_finished_by_the_cap_and_an_uncapped_one_finishes_all():
    trace = make_trace(30, 0.1, 256, 49152, seed=1)
    arrivals = [0.0] * 30
    capped = simulate("static", trace, arrivals, MODEL, drain=1.0, **SHAPE)  # far too short to serve 30
    s = summarize(capped, 1.0, 2.0, 0.25)
    assert 0 < s["finished"] < 30 and s["unfinished"] == 30 - s["finished"]
    assert all(r["end_s"] <= 1.0 for r in capped if r["status"] == "ok")  # a client past the cap has hung up
    assert all(r["end_s"] is None for r in capped if r["status"] != "ok")
    whole = simulate("static", trace, arrivals, MODEL, **SHAPE)
    assert all(r["status"] == "ok" and r["output_tokens"] == n for r, (_, n) in zip(whole, trace))
    assert max(r["end_s"] for r in whole) > 10.0  # many virtual seconds, in a fraction of a real one


def test_the_knees_come_in_the_papers_order():
    trace = make_trace(150, 0.1, 256, 49152, seed=0)
    gaps = poisson_arrivals(150, 1.0, seed=0)
    rates = [0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 6, 7, 8, 10, 12]
    systems = {}
    for key in SYSTEMS:
        runs = []
        for rate in rates:
            arrivals = [g / rate for g in gaps]
            out = simulate(key, trace, arrivals, MODEL, **SHAPE)
            runs.append({"rate": rate, "seeds": [summarize(out, math.inf, 2.0, 0.25)]})
        systems[key] = {"runs": runs}
    ratios = judge(systems, 2.0)
    held = [systems[k]["held_rate"] for k in SYSTEMS]
    assert None not in held and all(systems[k]["missed_rate"] for k in SYSTEMS)  # every knee inside the rates
    assert held == sorted(held)  # static <= orca max <= pow2 <= oracle <= paged
    assert held[0] < held[1] and held[-2] < held[-1]  # paging strictly last
    assert ratios["paged_vs_static"] == held[-1] / held[0] > 2


def test_judge_holds_every_system_to_one_bar_and_gives_an_interval_and_each_seeds_own_knee():
    def run(rate, *latencies, finished=4):
        return {"rate": rate, "seeds": [{"normalized_latency_s": x, "finished": finished, "requests": 4,
                                         "requests_per_s": rate} for x in latencies]}

    systems = {
        "static": {"runs": [run(1, 0.3, 0.3), run(2, 0.5, 0.7), run(4, 0.65, 0.9), run(8, 0.4, 0.4)]},
        "paged": {"runs": [run(1, 0.25, 0.35), run(2, 0.3, 0.3), run(4, 0.45, 0.45, finished=3), run(8, 0.1, 0.1)]},
    }
    ratios = judge(systems, 2.0)
    static, paged = systems["static"], systems["paged"]
    # one bar: twice the unloaded latency, the lowest mean at the lowest rate (0.3 for both here)
    assert static["threshold_s_per_token"] == paged["threshold_s_per_token"] == pytest.approx(0.6)
    assert (static["held_rate"], static["missed_rate"]) == (1, 2)  # one seed over 0.6 at 2: missed
    # each seed against its own unloaded latency (seed 0: paged's 0.25, so 0.5); after a miss, a rate
    # held again does not count
    assert static["seed_held_rates"] == [2, 1] and paged["seed_held_rates"] == [2, 2]
    assert [r["held"] for r in static["runs"]] == [True, False, False, False]
    assert static["runs"][1]["normalized_latency_s"] == pytest.approx(0.6)
    assert (static["runs"][1]["normalized_min_s"], static["runs"][1]["normalized_max_s"]) == (0.5, 0.7)
    assert (paged["held_rate"], paged["missed_rate"]) == (2, 4)  # an unfinished request misses the rate
    assert ratios == {"paged_vs_static": 2.0, "paged_vs_static_low": 1.0, "paged_vs_static_high": 4.0}


def test_unknown_systems_and_mismatched_traces_are_refused():
    with pytest.raises(ValueError, match="system='nope'"):
        simulate("nope", [([1], 1)], [0.0], MODEL, drain=1.0, **SHAPE)
    with pytest.raises(ValueError, match="arrivals"):
        simulate("paged", [([1], 1)], [0.0, 1.0], MODEL, drain=1.0, **SHAPE)
