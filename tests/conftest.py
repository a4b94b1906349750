"""Shared fixtures: the tiny random model (fast) and the real SmolLM2-135M (fetched once, cached), and
the notebook helpers."""

import json
import os
import sys
from pathlib import Path

import pytest

# These tests grade the package beside them, whatever else is installed: a student copy in a venv where
# the instructor's checkout is installed editable (pip install -e .) must test the student's code. The
# pytest command does not put this folder on sys.path (python -m pytest does), so it goes first here,
# before any test imports minipaged; where minipaged was imported from elsewhere already, say so.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import minipaged  # noqa: E402

if Path(minipaged.__file__).resolve().parent != ROOT / "minipaged":
    raise pytest.UsageError(f"these tests are {ROOT}'s, but minipaged was imported from "
                            f"{Path(minipaged.__file__).parent} before they started (a plugin or PYTHONPATH?); "
                            f"run `python -m pytest` in {ROOT}, or `pip install -e .` there")


def pytest_configure(config):
    """Under pytest-xdist (``-n auto``, the default in pyproject.toml) each worker gets one thread: two
    workers with two OpenMP threads each on a 2-core machine make every small matmul wait for a core
    (the suite then runs slower, not faster).
    Child processes (servers, notebook kernels) inherit the setting.
    MINIPAGED_HYPOTHESIS_PROFILE=fail-fast turns off hypothesis's shrinking."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)
    if os.environ.get("MINIPAGED_HYPOTHESIS_PROFILE") == "fail-fast":
        # A run that only asks whether a property fails (the exercises' teeth test) need not shrink the
        # failing example to its smallest form, which takes up to half a minute per property.
        from hypothesis import Phase, settings

        settings.register_profile("fail-fast", phases=[Phase.explicit, Phase.reuse, Phase.generate])
        settings.load_profile("fail-fast")


@pytest.fixture(scope="session")
def tiny_llm():
    from minipaged import LLM

    return LLM("tiny", progress=False)


@pytest.fixture
def run_notebook():
    """Execute a notebook top to bottom in a fresh kernel, in its own folder; returns the text that
    its code cells printed."""
    def run(path):
        nbformat = pytest.importorskip("nbformat")
        nbclient = pytest.importorskip("nbclient")
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
        return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)

    return run


@pytest.fixture
def rederive():
    """Run a notebook's cells tagged "rederive" (its hand-written versions of package code) in a fresh
    namespace holding ``names``; returns what they define, for a test to compare with the package."""
    def run(path, **names):
        namespace = dict(names)
        for cell in json.loads(Path(path).read_text())["cells"]:
            if "rederive" in cell["metadata"].get("tags", []):
                exec("".join(cell["source"]), namespace)
        return namespace

    return run


@pytest.fixture(scope="session")
def real_llm():
    from minipaged import LLM

    return LLM("smollm2-135m", progress=False)


# Prompts that exercise the tokenizer and the model: chat and raw text, non-ASCII, code, digits,
# runs of spaces and newlines.
PARITY_PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("chat", "Write a haiku about memory."),
    ("chat", "Translate to French: the cat sleeps on the warm stone."),
    ("raw", "The quick brown fox jumps over the lazy dog. The"),
    ("raw", "Héllo wörld! Ça va? 日本語のテキスト, emojis 😀🚀 and naïve café."),
    ("raw", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"),
    ("raw", "Numbers: 3.14159, 2718, 1,000,000 and 42 + 58 = 100. Next: 7 8 9"),
    ("raw", "Line one\n\n\nLine    four   has    spaces\t\ttabs\n    indented"),
]
