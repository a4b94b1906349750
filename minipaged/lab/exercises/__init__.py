"""Graded exercises: solution regions in the one source, a student copy with those regions stubbed,
and the chapter's tests as the grader. ``python -m minipaged.lab.exercises --help`` lists the commands.

    catalog/      the exercises, one TOML file per chapter: id, title, task, hint, the tests that grade it
    regions.py    finding the ``# exercise NN.K: begin / end`` regions and writing their stubs
    grader.py     the student copy, and running an exercise's tests against a copy
    pytest_results.py  the pytest plugin the grader reads outcomes from
"""
