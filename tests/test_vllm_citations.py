"""Every vLLM source path the course cites is one checked in the release it pins, named in one place.

docs/pages/about.md ("The vLLM release this course cites") names the release; the chapters link to
that section instead of naming a version. CHECKED lists the paths that were looked up in that
release's package (the file exists, and the names the text gives beside it are defined there). A
path cited anywhere else fails here until someone checks it in that release and adds it.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = "v0.10.2"
PATH = re.compile(r"vllm/[A-Za-z0-9_/]+\.(?:py|cu|cuh|h)\b")
# a release named beside vLLM's name or its files, e.g. "releases such as v0.8" or "vLLM 0.9.2"
RELEASE = re.compile(r"\bv0\.\d+(?:\.\d+)*\b|\bvLLM\s+0\.\d+|\breleases? such as\b")

CHECKED = frozenset("""
vllm/_custom_ops.py vllm/attention/backends/utils.py vllm/attention/layer.py vllm/beam_search.py
vllm/core/block/block_table.py vllm/core/block/common.py vllm/core/block/prefix_caching_block.py
vllm/core/block_manager.py vllm/core/interfaces.py vllm/core/scheduler.py vllm/engine/arg_utils.py
vllm/engine/async_llm_engine.py vllm/engine/llm_engine.py vllm/entrypoints/launcher.py
vllm/entrypoints/llm.py vllm/entrypoints/openai/serving_engine.py
vllm/entrypoints/openai/serving_tokenization.py vllm/entrypoints/utils.py
vllm/model_executor/layers/utils.py vllm/v1/attention/backends/flash_attn.py vllm/v1/core/block_pool.py
vllm/v1/core/kv_cache_manager.py vllm/v1/core/kv_cache_utils.py vllm/v1/core/sched/scheduler.py
vllm/v1/engine/async_llm.py vllm/v1/engine/core.py vllm/v1/engine/core_client.py
vllm/v1/engine/detokenizer.py vllm/v1/engine/llm_engine.py vllm/v1/engine/output_processor.py
vllm/v1/engine/parallel_sampling.py vllm/v1/engine/processor.py vllm/v1/kv_cache_interface.py vllm/v1/request.py
vllm/v1/metrics/loggers.py vllm/v1/metrics/reader.py vllm/v1/sample/rejection_sampler.py vllm/v1/sample/sampler.py
vllm/v1/serial_utils.py vllm/v1/spec_decode/utils.py vllm/v1/worker/block_table.py vllm/v1/worker/gpu_model_runner.py
vllm/v1/worker/gpu_worker.py vllm/worker/cache_engine.py vllm/worker/model_runner.py vllm/worker/worker.py
""".split())


def texts():
    """The course's text and code: chapters, docs pages, the README, the package's docstrings."""
    files = [*ROOT.glob("chapters/*/*.md"), *ROOT.glob("docs/pages/*.md"), ROOT / "README.md",
             *ROOT.glob("minipaged/**/*.py")]
    return {path: path.read_text() for path in sorted(files)}


def test_every_cited_path_was_checked_in_the_pinned_release():
    unchecked = {f"{path.relative_to(ROOT)}: {cited}" for path, text in texts().items()
                 for cited in PATH.findall(text) if cited not in CHECKED}
    assert not unchecked, (f"vLLM paths not checked in {PINNED} (look them up there, then add them to "
                           f"CHECKED): {sorted(unchecked)}")


def test_the_release_is_named_once_and_the_chapters_name_no_other():
    pages = {path: text for path, text in texts().items() if path.suffix == ".md"}
    named = [path for path, text in pages.items() for _ in re.finditer(re.escape(PINNED), text)]
    assert named == [ROOT / "docs/pages/about.md"], named
    chapters = {path: text for path, text in pages.items() if "chapters" in path.parts}
    others = {f"{path.relative_to(ROOT)}: {m.group(0)}" for path, text in chapters.items()
              for m in RELEASE.finditer(text)}
    assert not others, f"a chapter names a vLLM release; link to about.md's section instead: {sorted(others)}"
