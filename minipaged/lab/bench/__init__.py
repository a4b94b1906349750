"""Benchmarks. Each prints ratios measured side by side in one run (the machine may be noisy).

The options and the ending that several benchmarks share are written once here.
"""

from __future__ import annotations

from minipaged.lab import capture


def add_attention_argument(p, text: str = "attention backend (default: torch_batched)") -> None:
    """--attention: which of the engine's CPU attention backends every engine of the benchmark uses."""
    p.add_argument("--attention", default="torch_batched", choices=["torch_batched", "cpu", "torch"], help=text)


def add_output_arguments(p, figures: str, table: str = "tables") -> None:
    """--plot-dir, where the benchmark also saves ``figures``, and --json, one JSON object instead of its
    ``table``."""
    p.add_argument("--plot-dir", default=None, help=f"also save {figures} there")
    p.add_argument("--json", action="store_true", help=f"print one JSON object instead of {table}")


def identical_outputs_line(r: dict, runs: str) -> str:
    """A report's verdict on correctness: whether the outputs were the same, token for token, ``runs``
    (e.g. "in every run")."""
    return f"identical outputs, token for token, {runs}: {'yes' if r['identical_outputs'] else 'NO'}"


def finish(r: dict, as_json: bool, report) -> int:
    """A benchmark's last step: hand ``r`` to a record being made, print it (one JSON object, or
    ``report(r)``), and exit 1 unless every system gave the same outputs."""
    capture.emit(r, as_json)
    if not as_json:
        print(report(r))
    return 0 if r["identical_outputs"] else 1
