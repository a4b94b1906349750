"""The worked answers' computed figures (minipaged/lab/answers.py) against the chapters that quote them.

Every ``<!-- calc: NN/NAME PATH SPEC -->`` marker is run again here, and the number before it must be
what the computation gives now; every computation must be quoted somewhere.
"""

import json

import pytest

from minipaged.lab import answers, capture, records
from minipaged.scheduler.continuous import ContinuousScheduler


def _calc_markers():
    for text_file, _ in records.rendered_files():
        for m in records.CALC.finditer(text_file.read_text()):
            yield text_file.relative_to(records.ROOT).as_posix(), m


def test_every_computed_figure_is_what_its_computation_gives_now():
    stale, seen = [], 0
    for where, m in _calc_markers():
        seen += 1
        value = records.lookup({"results": answers.compute(m["name"])}, m["path"])
        if m["value"] != records.fmt(value, m["spec"]):
            stale.append(f"{where}: {m['value']} but `python -m minipaged.lab.answers {m['name']}` gives "
                         f"{records.fmt(value, m['spec'])} at {m['path']}")
    assert seen >= 50, f"only {seen} computed figures found"
    assert not stale, "run `python -m minipaged.lab.records render` and review the diff:\n" + "\n".join(stale)


def test_every_computation_is_quoted_by_a_chapter():
    quoted = {m["name"] for _, m in _calc_markers()}
    assert set(answers.REGISTRY) <= quoted, f"computations no chapter quotes: {set(answers.REGISTRY) - quoted}"


def test_an_unknown_computation_names_the_known_ones(capsys):
    with pytest.raises(ValueError, match="no answer computation named '06/nope'.*06/saw_tooth"):
        answers.compute("06/nope")
    with pytest.raises(ValueError, match="no answer computation"):
        records.render_text("1<!-- calc: 06/nope steps d -->", None)
    assert answers.main(["06/nope"]) == 2 and "06/saw_tooth" in capsys.readouterr().err


def test_a_calc_marker_is_rewritten_from_its_computation(monkeypatch):
    monkeypatch.setitem(answers.REGISTRY, "99/made_up", lambda: {"a": {"b": 0.9853}, "n": [12688]})
    text = "util 12.0%<!-- calc: 99/made_up a.b .1% --> over 5<!-- calc: 99/made_up n.0 ,d --> steps"
    out = records.render_text(text, None)
    assert out.text == ("util 98.5%<!-- calc: 99/made_up a.b .1% --> over 12,688<!-- calc: 99/made_up n.0 ,d --> "
                        "steps") and out.calcs == {"99/made_up"}
    assert records.render_text(out.text, None).text == out.text
    with pytest.raises(ValueError, match="'a.c' is not in the results of `python -m minipaged.lab.answers 99/made_up`"):
        records.render_text("1<!-- calc: 99/made_up a.c d -->", None)


def test_the_saw_tooth_is_the_longest_request_and_the_sum_of_the_lengths(capsys):
    """The static batch of question 6.1 against arithmetic: it runs as long as its longest member, and
    its sequence-steps are the sum of the output lengths."""
    lengths = [5] * 7 + [100]
    assert answers.main(["06/saw_tooth"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["steps"] == max(lengths) and got["sequence_steps"] == sum(lengths)
    assert got["mean_batch"] == pytest.approx(sum(lengths) / max(lengths))
    assert got["first_batches"] == [8] * 5 + [1] * 3


def test_a_changed_rule_is_undone_after_its_computation():
    before = ContinuousScheduler._schedule_running
    result = answers.compute("06/largest_victim")
    assert ContinuousScheduler._schedule_running is before
    # the two rules differ where they should: fewer preemptions, more recomputed work
    assert result["largest"]["preemptions"] < result["newest"]["preemptions"]
    assert result["largest"]["tokens_computed"] > result["newest"]["tokens_computed"]


# ---- what the answers say about their figures, beyond the figures themselves


def test_without_the_promise_a_cold_batch_finds_nothing_and_a_warm_one_the_same():
    r = answers.compute("07/no_promises")
    assert r["promise"]["cold"][0] == 0 and min(r["promise"]["cold"][1:]) >= 36
    assert r["no_promise"]["cold"] == [0] * 8 and r["no_promise"]["again"] == r["promise"]["again"]


def test_a_prompt_served_whole_from_the_cache_takes_its_neighbours_row():
    r = answers.compute("07/whole_prompt")
    assert r["again"] != r["right"] and r["other_again"] == r["other_right"]
    assert r["again"][0] == r["other_right"][0] and r["again"][1:] == r["follows_first"]


def test_sampling_every_chunk_appends_the_chunks_next_tokens():
    r = answers.compute("08/sample_every_chunk")
    assert len(r["wrong"]) == len(r["right"]) and all(w != t for w, t in zip(r["wrong"], r["right"]))  # all wrong
    assert r["wrong"][:2] == r["after_chunks"] and r["wrong"][2:] == r["answer_to_them"]


def test_the_largest_victim_delays_every_one_of_the_longest_requests():
    assert answers.compute("06/largest_victim")["longest_all_later"]


def test_a_changed_scheduler_runs_the_same_trace_as_the_record_it_is_compared_with():
    row = records.lookup(capture.load(None, "08/simulate_chunked"), "rows.4")
    assert row["budget"] == 256
    unchanged = answers.compute("08/two_partials")["unchanged_256"]
    assert unchanged == {"ttft_short_p50": row["ttft_short_p50"], "ttft_long_p50": row["ttft_long_p50"]}


def test_with_the_default_overhead_budget_256_stays_inside_five_percent():
    assert answers.compute("08/step_overhead")["default_256_inside"]
