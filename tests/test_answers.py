"""The worked answers' computed figures (minipaged/answers.py) against the chapters that quote them.

Every ``<!-- calc: NN/NAME PATH SPEC -->`` marker is run again here, and the number before it must be
what the computation gives now; every computation must be quoted somewhere.
"""

import json

import pytest

from minipaged import answers, records
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
            stale.append(f"{where}: {m['value']} but `python -m minipaged.answers {m['name']}` gives "
                         f"{records.fmt(value, m['spec'])} at {m['path']}")
    assert seen >= 50, f"only {seen} computed figures found"
    assert not stale, "run `python -m minipaged.records render` and review the diff:\n" + "\n".join(stale)


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
    with pytest.raises(ValueError, match="'a.c' is not in the results of `python -m minipaged.answers 99/made_up`"):
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
