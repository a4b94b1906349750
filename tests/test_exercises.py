"""The graded exercises (minipaged/lab/exercises/): the catalog agrees with the source and the text, the
commands work, and (slow) every exercise has teeth: its tests fail while its region is a stub and pass
with the reference code."""

import csv
import io
import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from minipaged.lab.exercises.__main__ import main as exercises_main
from minipaged.lab.exercises.answers import quote_mismatch, quoted_blocks, solution_lines, squeeze, text_files
from minipaged.lab.exercises.catalog import Exercise, all_exercises
from minipaged.lab.exercises.grader import run_tests, student_copy
from minipaged.lab.exercises.regions import find_regions, is_stub, stub_file
from minipaged.lab.exercises.render import stale_files

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = all_exercises()
# One thread per child pytest: the teeth test runs two of them side by side on a 2-core machine. The
# children only need to know whether a stubbed exercise's tests fail, not the smallest failing example.
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MINIPAGED_HYPOTHESIS_PROFILE": "fail-fast"}


def test_every_exercise_has_a_region_and_every_region_an_exercise():
    regions = find_regions(ROOT)
    ids = [e.id for e in EXERCISES]
    assert sorted(regions) == sorted(ids), "a region without an exercise, or an exercise without a region"
    for e in EXERCISES:
        assert e.id[:2].isdigit() and e.id[2] == "." and e.id[3:].isdigit(), e.id
        assert e.title and len(e.task) > 60 and e.hint and e.tests and e.minutes > 0, e.id


def test_every_chapter_has_at_least_two_exercises():
    per_chapter = Counter(e.chapter for e in EXERCISES)
    for chapter in [f"{n:02d}" for n in range(12)]:
        assert per_chapter[chapter] >= 2, f"chapter {chapter} has {per_chapter[chapter]} graded exercises"


def test_every_stubbed_file_is_valid_python_and_keeps_its_markers():
    regions = find_regions(ROOT)
    by_id = {e.id: e for e in EXERCISES}
    by_file = {}
    for region in (r for found in regions.values() for r in found):
        by_file.setdefault(region.path, []).append(region)
    for rel, file_regions in by_file.items():
        text = stub_file((ROOT / rel).read_text(), file_regions, by_id)
        compile(text, str(rel), "exec")
        for region in file_regions:
            assert f"# exercise {region.exercise_id}: begin" in text
            assert any("raise NotImplementedError(" in line and f"exercise {region.exercise_id}: " in line
                       for line in text.splitlines()), region
        assert len(text.splitlines()) < len((ROOT / rel).read_text().splitlines()) + 12 * len(file_regions)


def test_every_named_test_exists():
    selectors = sorted({t for e in EXERCISES for t in e.tests})
    for s in selectors:
        assert (ROOT / s.split("::")[0]).is_file(), f"{s}: no such test file"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=--import-mode=importlib", *selectors],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, **CHILD_ENV})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    for s in selectors:
        found = any(c == s or c.startswith(s + "::") or c.startswith(s + "[") for c in collected)
        assert found, f"{s} collects nothing"


def test_the_chapters_and_the_instructor_page_list_the_catalog():
    assert stale_files(ROOT, EXERCISES) == [], "run `python -m minipaged.lab.exercises render`"


def test_list_as_json(capsys):
    assert exercises_main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [x["id"] for x in listed] == [e.id for e in EXERCISES]
    assert all(x["files"] and all(f.startswith("minipaged/") for f in x["files"]) and x["tests"] for x in listed)


def test_student_copy_stubs_only_what_it_is_asked(tmp_path):
    first, second = EXERCISES[0], EXERCISES[-1]
    student_copy(ROOT, tmp_path / "copy", [first])
    regions = find_regions(tmp_path / "copy")
    assert sorted(regions) == sorted(e.id for e in EXERCISES)  # markers stay
    for region in regions[first.id]:
        assert f"exercise {first.id}: {first.title}" in (tmp_path / "copy" / region.path).read_text()
    stubbed_files = {r.path for r in regions[first.id]}
    for region in regions[second.id]:
        if region.path not in stubbed_files:
            assert (tmp_path / "copy" / region.path).read_text() == (ROOT / region.path).read_text()
    assert not (tmp_path / "copy" / ".git").exists()


def test_a_student_copy_holds_no_worked_answer_and_no_quote_of_the_code_to_write(tmp_path):
    copy = student_copy(ROOT, tmp_path / "copy", EXERCISES)
    answers_in_reference = sum(path.read_text().count("<summary>Answer</summary>") for path in text_files(ROOT))
    assert answers_in_reference > 0 and copy.left_out.answers == answers_in_reference
    assert copy.left_out.quotes, "the chapters quote no solution region?"
    regions = find_regions(ROOT)
    for path in text_files(tmp_path / "copy"):
        text = path.read_text()
        assert "<summary>Answer</summary>" not in text, path
        if path.name == "README.md" and path.parent == tmp_path / "copy":
            continue  # the README shows a wrong first attempt at 03.1 on purpose, to show `check`'s output
        lines = {squeeze(line) for line in text.splitlines()}
        for exercise_id, exercise_regions in regions.items():
            given_away = lines & solution_lines(ROOT, exercise_regions)
            assert not given_away, f"{path.relative_to(tmp_path)} still quotes exercise {exercise_id}: {given_away}"
    # what is left of the quotes still matches the (stubbed) package: the copy's quotes test passes
    problems = [quote_mismatch(tmp_path / "copy", *block[1:]) for block in quoted_blocks(tmp_path / "copy")]
    assert not any(problems), [p for p in problems if p]


def test_keep_answers_keeps_the_text_as_it_is(tmp_path):
    copy = student_copy(ROOT, tmp_path / "copy", EXERCISES, keep_answers=True)
    assert copy.left_out.answers == 0 and not copy.left_out.quotes
    for path in text_files(ROOT):
        assert (tmp_path / "copy" / path.relative_to(ROOT)).read_text() == path.read_text(), path


def test_a_partial_copy_leaves_out_only_the_quotes_of_its_own_exercises(tmp_path):
    copy = student_copy(ROOT, tmp_path / "copy", [e for e in EXERCISES if e.id == "03.1"])
    assert set(copy.left_out.quotes) == {"03.1"}
    chapter = "chapters/03_block-table/README.md"
    text = (tmp_path / "copy" / chapter).read_text()
    assert "exercise 03.1 asks you to write in `minipaged/kv/block_table.py`" in text
    # 03.2 is not handed out: its quote stays
    assert "# minipaged/kv/block_table.py, BlockTablePolicy.append_slots" in text


def test_bad_requests_say_what_to_do(tmp_path, capsys):
    with pytest.raises(SystemExit):
        exercises_main(["check", "99.9"])
    assert "unknown exercise ids ['99.9']" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SystemExit):
        exercises_main(["student", str(tmp_path / "full")])
    assert "is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        exercises_main(["student", str(tmp_path / "new"), "--upto", "x4"])
    with pytest.raises(ValueError, match="no '# exercise NN.K"):
        student_copy(ROOT, tmp_path / "other", [Exercise("98.1", "t", "task " * 20, "h", ("tests",))])


# ---- teeth (slow: a pytest run per exercise) ---------------------------------------------------


def _before(index, tmp_path):
    """A student works in id order. The copy they hold before writing exercise ``index`` has it and
    every later one stubbed: there its tests must fail, and the tests of the exercise just before it,
    written by now, must pass. One pytest run checks both (this suite, run on the reference, covers the
    last one)."""
    stubbed = EXERCISES[index:]
    copy = tmp_path / f"before_{stubbed[0].id}"
    student_copy(ROOT, copy, stubbed)
    *done, todo = run_tests(copy, [*EXERCISES[max(index - 1, 0):index], stubbed[0]], timeout=600, env=CHILD_ENV)
    return stubbed[0].id, todo, done


@pytest.mark.slow
def test_every_exercise_fails_while_stubbed_and_passes_once_written(tmp_path):
    # The reference itself (every region written) runs all these tests in this suite already.
    regions = find_regions(ROOT)
    assert not [e.id for e in EXERCISES if is_stub(ROOT, regions[e.id])], "the reference holds a stub"
    with ThreadPoolExecutor(2) as pool:
        checked = list(pool.map(lambda i: _before(i, tmp_path), range(len(EXERCISES))))
    for exercise_id, todo, done in checked:
        assert not todo.error, f"{exercise_id}: {todo.error}"
        assert todo.stub and todo.first_failure() is not None, (
            f"exercise {exercise_id}: every test passes while its region is a stub")
        for r in done:
            assert r.ok, (f"exercise {r.exercise.id} fails with only later exercises stubbed (its tests must rely "
                          f"on earlier exercises only): {r.error or r.first_failure()}")


@pytest.mark.slow
def test_a_copy_with_every_exercise_stubbed_imports_and_collects(tmp_path):
    copy = tmp_path / "all"
    student_copy(ROOT, copy, EXERCISES)
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(copy)}
    # the compile-time modules need the real numba.cuda, chosen when numba is first imported: each gets
    # a process of its own; every other module is imported in one walk
    fresh = ("minipaged.lab.kernels.ptx",)
    walk = (f"import importlib, pkgutil, minipaged; assert minipaged.__file__.startswith({str(copy)!r}); "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(minipaged.__path__, 'minipaged.') "
            f"if '__main__' not in m.name and m.name not in {fresh!r}]")
    for code in (walk, *(f"import {name}" for name in fresh)):
        proc = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=--import-mode=importlib", "tests"], cwd=copy, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.slow
def test_grade_writes_one_row_per_copy_and_exercise(tmp_path, capsys):
    chosen = [e for e in EXERCISES if e.chapter == "03"][:2]
    ids = ",".join(e.id for e in chosen)
    student_copy(ROOT, tmp_path / "alice", chosen[1:])  # the later one left as a stub
    student_copy(ROOT, tmp_path / "bob", [])  # everything written (the reference)
    assert exercises_main(["grade", str(tmp_path / "alice"), str(tmp_path / "bob"), "--only", ids,
                           "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    expected = [(c, e.id) for c in ("alice", "bob") for e in chosen]
    assert [(Path(r["copy"]).name, r["exercise"]) for r in rows] == expected
    status = {(Path(r["copy"]).name, r["exercise"]): r["status"] for r in rows}
    assert status[("alice", chosen[1].id)] == "not attempted" and rows[1]["first_failure"]
    assert status[("alice", chosen[0].id)] == "pass" and status[("bob", chosen[1].id)] == "pass"
    assert rows[0]["passed"] == rows[0]["total"] != "0"


def test_a_student_copy_tests_its_own_code_whatever_is_installed(tmp_path):
    """The README installs this checkout editable (pip install -e .), so `import minipaged` anywhere in the
    venv finds the answer key. A student copy's plain `pytest` (the console script, which does not put the
    copy on sys.path, unlike `python -m pytest`) must still test the copy's stubs, and must refuse to run
    when something imported another checkout's package first."""
    script = Path(sys.executable).parent / "pytest"
    if not script.exists():
        pytest.skip(f"no pytest console script beside {sys.executable}: pip install pytest")
    elsewhere = subprocess.run([sys.executable, "-c", "import minipaged; print(minipaged.__file__)"], cwd=tmp_path,
                               env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                               capture_output=True, text=True)
    if elsewhere.returncode != 0:
        pytest.skip("minipaged is not installed in this venv, so no other copy can shadow a student's: "
                    "pip install -e . to run this test")
    exercise = next(e for e in EXERCISES if e.chapter == "01")
    copy = tmp_path / "student"
    student_copy(ROOT, copy, [exercise])
    assert not elsewhere.stdout.strip().startswith(str(copy)), "the installed minipaged must be another one"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **CHILD_ENV}
    args = [str(script), "-q", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib"]
    graded = subprocess.run([*args, *exercise.tests], cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert graded.returncode == 1, graded.stdout[-3000:]  # the stub's tests fail: the copy's code was tested
    assert f"exercise {exercise.id}" in graded.stdout, graded.stdout[-3000:]
    shadowed = subprocess.run([*args, "-p", "minipaged", *exercise.tests], cwd=copy, env=env, capture_output=True,
                              text=True, timeout=600)
    assert shadowed.returncode != 0 and "minipaged was imported from" in shadowed.stdout + shadowed.stderr, \
        (shadowed.stdout + shadowed.stderr)[-3000:]
