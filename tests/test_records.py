"""The chapters' measured figures against their results records (minipaged/lab/records.py).

Every table a chapter shows between record markers must be what its record renders, every figure
marked in a sentence must equal the record's value, and in the chapters listed in RECORDED every
measured-looking number in a "Measured" section must come from a record (or say it is cited).
"""

import json
import re

import pytest

from minipaged.lab import capture, records

# Chapters whose measured sections are wholly rendered from records.
RECORDED = ["00_the-kv-cache", "01_contiguous-cache", "02_fixed-blocks", "03_block-table", "04_on-demand-allocation",
            "05_copy-on-write", "06_continuous-batching", "07_prefix-caching", "08_chunked-prefill",
            "09_speculative-decoding", "10_paged-attention-kernel", "11_serving"]

# a percentage, a ratio (3.25×, 3 ×) or a decimal; "2 × 32" is a product, whose factors need not be figures
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d[\d,]*(?:\.\d+)?(?:\s?%|×|\s×(?!\s+[\d(#]))|(?<![\w.])\d+\.\d+(?![\w.])")
CITED = re.compile(r"<!-- cited: [^>]* -->")


def test_every_chapter_and_page_is_what_its_records_render():
    """The records' figures (the computed ones are test_answers.py's: each runs once, there)."""
    stale = []
    for text_file, chapter in records.rendered_files():
        text = text_file.read_text()
        if records.render_text(text, chapter, calcs=False).text != text:
            stale.append(text_file.relative_to(records.ROOT).as_posix())
    assert not stale, f"run `python -m minipaged.lab.records render` and review the diff: {stale}"


def test_the_paper_page_renders_every_result_from_records():
    page = records.PAGES / "paper.md"
    rendered = records.render_text(page.read_text(), None)
    assert rendered.figures >= 20 and {"01/simulate", "04/simulate", "05/simulate_sharing",
                                       "06/bench_serving"} <= rendered.records
    for figure in ("Fig. 2", "Fig. 12", "Fig. 15", "Fig. 18", "Fig. 19"):
        assert f"## {figure}:" in page.read_text(), f"the paper page lost its {figure} section"
    # its own numbers are all rendered or cited, as a chapter's measured sections must be
    loose = _unrecorded_numbers(page.read_text().split("## Fig. 2", 1)[1])
    assert not loose, loose


def test_a_page_must_name_the_chapter_of_a_record():
    with pytest.raises(ValueError, match="name its chapter"):
        records.render_text("1.0<!-- fig: simulate policies.on_demand.utilization .1% -->", None)


def test_every_record_is_complete_and_from_committed_code():
    for path in sorted(records.CHAPTERS.glob("*/results/*.json")):
        r = json.loads(path.read_text())
        for key in ("command", "commit", "date", "machine", "stdout", "results"):
            assert r.get(key) not in (None, ""), f"{path}: no {key!r}"
        # a GPU run is taken on another machine by the script that runs chapter 10's checks there
        gpu = r["machine"].get("gpu")
        assert r["command"].startswith("python -m minipaged ") or (gpu and "scripts/gpu_check.sh" in r["command"]), path
        assert "--record" not in r["command"], path
        assert not r["dirty"], f"{path} was measured with uncommitted changes to minipaged/: measure it again"
        assert {"cpu", "cores", "torch"} <= set(r["machine"]), path
        if gpu:
            assert {"sms", "driver", "cuda", "numba_cuda"} <= set(r["machine"]), path


def _measured_sections(text: str):
    """(heading, body) of every section whose heading starts with "Measured", up to the next heading
    of the same or a higher level (its subsections belong to it)."""
    for m in re.finditer(r"^(#{2,3}) (Measured[^\n]*)\n", text, re.M):
        end = re.compile(rf"^#{{1,{len(m.group(1))}}} ", re.M).search(text, m.end())
        yield m.group(2), text[m.end():end.start() if end else len(text)]


def _unrecorded_numbers(body: str) -> list[str]:
    body = records.BLOCK.sub("", body)
    body = re.sub(r"```.*?```", "", body, flags=re.S)  # commands and code
    body = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))*`", "", body)  # inline code, even over a line break: options
    # a marked figure stays a number ("16 × 46,080<!-- calc: ... -->" is still a product)
    body = records.CALC.sub("#", records.FIG.sub("#", body))
    body = re.sub(r"\S*\d\S*\s*" + CITED.pattern, "", body)
    body = re.sub(r"!\[[^\]]*\]\([^)]*\)|\]\([^)]*\)", "", body)  # image and link targets
    body = re.sub(r"§\d+(?:\.\d+)*", "", body)  # a paper's section numbers are not figures
    body = re.sub(r"exercises? \d\d\.\d+", "", body)  # nor are the graded exercises' numbers
    return NUMBER.findall(body)


@pytest.mark.parametrize("name", RECORDED)
def test_every_measured_figure_has_a_record(name):
    text = "\n".join(page.read_text() for page in records.chapter_pages(records.CHAPTERS / name))
    assert records.render_text(text, records.CHAPTERS / name, calcs=False).records, f"{name} quotes no record"
    sections = list(_measured_sections(text))
    assert sections, f"{name} has no Measured section"
    loose = {heading: found for heading, body in sections if (found := _unrecorded_numbers(body))}
    assert not loose, (f"{name}: these figures are in no record; mark each with <!-- fig: NAME PATH SPEC --> "
                       f"(or <!-- cited: SOURCE --> for a number quoted from elsewhere): {loose}")


# Chapters whose worked answers (under "Open questions") are wholly rendered from records and from the
# computations of minipaged/lab/answers.py.
ANSWERED = ["06_continuous-batching", "07_prefix-caching", "08_chunked-prefill", "09_speculative-decoding",
            "10_paged-attention-kernel", "11_serving"]


def _worked_answers(text: str) -> list[str]:
    """The body of every folded answer after the chapter's "### Open questions" heading."""
    start = text.find("### Open questions")
    assert start >= 0, "no Open questions section"
    end = re.compile(r"^## ", re.M).search(text, start)
    section = text[start:end.start() if end else len(text)]
    return re.findall(r'<details markdown="1"><summary>Answer</summary>\n(.*?)</details>', section, re.S)


@pytest.mark.parametrize("name", ANSWERED)
def test_every_figure_in_a_worked_answer_has_a_record_or_a_computation(name):
    answers = _worked_answers((records.CHAPTERS / name / "README.md").read_text())  # the core path's questions
    assert len(answers) >= 5, f"{name}: found {len(answers)} worked answers"
    loose = {i + 1: found for i, body in enumerate(answers) if (found := _unrecorded_numbers(body))}
    assert not loose, (f"{name}: these figures in the worked answers (by question) come from nowhere; mark each "
                       f"with <!-- fig: NAME PATH SPEC --> or <!-- calc: NN/NAME PATH SPEC --> "
                       f"(minipaged/lab/answers.py), or write an input as code: {loose}")


def test_the_answer_scan_finds_loose_figures_and_skips_marked_ones():
    text = ("### Open questions\n\n1. **Q.** Ask 2.5%?\n\n    <details markdown=\"1\"><summary>Answer</summary>\n\n"
            "    It took 1.35 steps, 12.0%<!-- calc: 06/saw_tooth mean_batch .1% --> marked, `0.01` an input.\n\n"
            "    </details>\n\n## Summary\nnot 9.5%\n")
    assert [_unrecorded_numbers(body) for body in _worked_answers(text)] == [["1.35"]]


# ---- the renderer itself, on a record made up here


def _fake(tmp_path, results, stdout="a\nb\nc\n"):
    chapter = tmp_path / "99_fake"
    (chapter / "results").mkdir(parents=True)
    record = {"command": "python -m minipaged simulate --x", "commit": "abc1234", "dirty": False,
              "date": "2026-01-02 03:04 UTC", "machine": {"cpu": "Some CPU", "cores": 2, "torch": "2.0"},
              "stdout": stdout, "results": results}
    (chapter / "results" / "r.json").write_text(json.dumps(record))
    return chapter


def test_a_figure_is_rewritten_from_its_record(tmp_path):
    chapter = _fake(tmp_path, {"a": {"util": 0.9853}, "rows": [{"x": 3.254}], "n": 12688,
                               "by name": {"whole run": {"p99": 0.4531}}})
    text = ("util 12.0%<!-- fig: r a.util .1% --> and 1.00×<!-- fig: r rows.0.x .2fx --> "
            "over 5<!-- fig: r n d --> steps, p99 1<!-- fig: r \"by name.whole run.p99\" ms:.0f --> ms")
    out = records.render_text(text, chapter)
    assert out.text == ("util 98.5%<!-- fig: r a.util .1% --> and 3.25×<!-- fig: r rows.0.x .2fx --> "
                        "over 12688<!-- fig: r n d --> steps, "
                        "p99 453<!-- fig: r \"by name.whole run.p99\" ms:.0f --> ms")
    assert out.figures == 4 and out.records == {"r"}
    assert records.render_text(out.text, chapter).text == out.text  # rendering twice changes nothing


def test_a_block_shows_the_command_its_output_and_where_it_was_measured(tmp_path):
    chapter = _fake(tmp_path, {"a": 1})
    text = "before\n<!-- record: r lines=2-3 -->\nstale\n<!-- /record -->\nafter"
    out = records.render_text(text, chapter).text
    assert "```bash\npython -m minipaged simulate --x\n```" in out
    assert "```\nb\nc\n```" in out and "\na\n" not in out
    assert "commit `abc1234` on 2026-01-02" in out and "Some CPU, 2 cores, torch 2.0" in out
    assert out.startswith("before\n<!-- record: r lines=2-3 -->\n") and out.endswith("<!-- /record -->\nafter")


def test_a_missing_record_or_path_says_what_to_run(tmp_path):
    chapter = _fake(tmp_path, {"a": 1})
    with pytest.raises(ValueError, match="--record 99/nope"):
        records.render_text("<!-- record: nope -->\n<!-- /record -->", chapter)
    with pytest.raises(ValueError, match="'b' is not in record 'r'"):
        records.render_text("1<!-- fig: r b d -->", chapter)


def test_measure_skips_a_gpu_record_and_says_where_it_comes_from(capsys):
    assert records.main(["measure", "--chapter", "10", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[10/gpu_check] skipped: measured on an NVIDIA H200" in out and "scripts/gpu_check.sh" in out


def test_a_part_of_the_output_is_kept_by_name(tmp_path):
    chapter = _fake(tmp_path, {"a": 1}, stdout="== one ==\nx\ny\n== two ==\nz\n")
    out = records.render_text("<!-- record: r part=one -->\n<!-- /record -->", chapter).text
    assert "```\nx\ny\n```" in out and "z" not in out
    with pytest.raises(ValueError, match="no part 'three'"):
        records.render_text("<!-- record: r part=three -->\n<!-- /record -->", chapter)


def test_a_measured_section_takes_in_its_subsections():
    text = "## Measured\nintro 1.5%\n### On the model\nsub 2.5%\n## How vLLM does it\nnot 3.5%\n"
    assert [_unrecorded_numbers(body) for _, body in _measured_sections(text)] == [["1.5%", "2.5%"]]


def test_figures_without_a_record_are_found():
    body = ("We measured 98.5% and 3.25× here, 1.5 ms there; 12.0%<!-- fig: r a .1% --> is marked, "
            "`--rate 1.5` is an option, and the paper's 20.4%<!-- cited: the paper, Fig. 2 --> is cited.\n"
            "```\n9.9%\n```\n")
    assert _unrecorded_numbers(body) == ["98.5%", "3.25×", "1.5"]


def test_record_writes_command_commit_machine_output_and_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(capture, "chapter_dir", lambda number: tmp_path / number)
    from minipaged.lab.simulator import cli

    argv = ["--policy", "contiguous", "--reservation", "max", "--num-requests", "20", "--capacity", "4096",
            "--record", "07/mine"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    r = json.loads((tmp_path / "07" / "results" / "mine.json").read_text())
    assert r["command"] == ("python -m minipaged simulate --policy contiguous --reservation max "
                            "--num-requests 20 --capacity 4096")
    assert r["stdout"] == printed and "contiguous(max)" in printed
    assert r["results"]["policies"]["contiguous(max)"]["finished"] == 20
    assert r["machine"]["cores"] >= 1 and len(r["commit"]) >= 7


def test_a_bare_record_goes_to_the_chapter_of_the_mode():
    from minipaged.lab.simulator import cli

    parse = cli.build_parser().parse_args
    assert cli.record_default(parse(["--policy", "contiguous"])) == "01/simulate"
    assert cli.record_default(parse(["--policy", "contiguous", "block_table"])) == "03/simulate"
    assert cli.record_default(parse([])) == "04/simulate"
    assert cli.record_default(parse(["--prefix"])) == "07/simulate_prefix"
    assert capture.record_path("x", "6").parent.parent.name == "06_continuous-batching"
    with pytest.raises(ValueError, match="no chapter"):
        capture.record_path("x", "42")


def test_measure_reruns_each_record_under_its_own_name(capsys, monkeypatch):
    """`measure` runs every record's own command again with --record NN/NAME, so the record is replaced
    in place; it refuses to measure uncommitted code."""
    assert records.main(["measure", "--chapter", "4", "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    names = sorted(p.stem for p in (records.CHAPTERS / "04_on-demand-allocation" / "results").glob("*.json"))
    assert [line.split("]")[0] for line in printed] == [f"[04/{n}" for n in names]
    assert all(line.split("] ")[1].startswith("python -m minipaged ") for line in printed)
    ran = []
    monkeypatch.setattr(records, "git_commit", lambda: {"commit": "abc", "dirty": False})
    done = type("Done", (), {"returncode": 0})
    monkeypatch.setattr(records.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or done)
    assert records.main(["measure", "--chapter", "04", "--only", "simulate"]) == 0
    assert len(ran) == 1 and ran[0][1:] == ["-m", "minipaged", "simulate", "--record", "04/simulate"]
    assert records.main(["measure", "--chapter", "x"]) == 2 and "--chapter must be one of" in capsys.readouterr().err
    assert records.main(["measure", "--chapter", "04", "--only", "simulate", "nope"]) == 2
    assert "--only: no record named nope" in capsys.readouterr().err
    monkeypatch.setattr(records, "git_commit", lambda: {"commit": "abc", "dirty": True})
    assert records.main(["measure", "--chapter", "04"]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
