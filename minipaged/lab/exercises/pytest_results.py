"""A pytest plugin the grader loads (``-p minipaged.lab.exercises.pytest_results``): it writes one JSON line
per test to the file named by $MINIPAGED_RESULTS: the node id, passed or failed, and the first line of
the error. The grader reads that file instead of parsing pytest's screen output."""

from __future__ import annotations

import json
import os


def _first_error_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.splitlines()[0][:300]
    text = str(report.longrepr or "").strip().splitlines()
    return (text[-1] if text else "")[:300]


def pytest_runtest_logreport(report):
    path = os.environ.get("MINIPAGED_RESULTS")
    if not path:
        return
    if report.when == "call" or report.outcome != "passed":  # a setup or teardown counts only when it did not pass
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "when": report.when,
                                "message": "" if report.passed else _first_error_line(report)}) + "\n")


def pytest_collectreport(report):
    path = os.environ.get("MINIPAGED_RESULTS")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "outcome": "failed", "when": "collect",
                                "message": _first_error_line(report)}) + "\n")
