"""Each chapter's idea in one module, and the default policy's calls each in one place.

For chapters 01-09 the mechanism a chapter teaches lives in one module whose docstring opens with
the chapter, says what it adds and what it does not handle yet; its class adds to the previous stage
and stays selectable by name. The default policy (prefix_caching) is the last of five stages, but a
reader of its ``allocate`` or ``free`` reads one method: no stage below it runs a method of the same
name (traced here), only named helpers and the pool.
"""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from minipaged.kv.base import KVPolicy
from minipaged.kv.factory import make_policy
from minipaged.kv.prefix_cache import PrefixCachingPolicy
from minipaged.scheduler import make_scheduler

ROOT = Path(__file__).resolve().parents[1]

# chapter -> (module, its class, the class it adds to, how to select it by name)
STAGES = {
    "01": ("minipaged.kv.contiguous", "ContiguousArena", KVPolicy, {"policy": "contiguous"}),
    "02": ("minipaged.kv.fixed_blocks", "FixedBlockPolicy", KVPolicy, {"policy": "fixed_blocks"}),
    "03": ("minipaged.kv.block_table", "BlockTablePolicy", KVPolicy, {"policy": "block_table"}),
    "04": ("minipaged.kv.on_demand", "OnDemandPolicy", "BlockTablePolicy", {"policy": "on_demand"}),
    "05": ("minipaged.kv.shared", "SharedPolicy", "OnDemandPolicy", {"policy": "shared"}),
    "06": ("minipaged.scheduler.continuous", "ContinuousScheduler", object, {"scheduler": "continuous"}),
    "07": ("minipaged.kv.prefix_cache", "PrefixCachingPolicy", "SharedPolicy", {"policy": "prefix_caching"}),
    "08": ("minipaged.scheduler.chunked", "ChunkedPrefillScheduler", "ContinuousScheduler",
           {"scheduler": "continuous", "enable_chunked_prefill": True}),
    "09": ("minipaged.scheduler.speculative", "SpeculativeScheduler", "ContinuousScheduler",
           {"scheduler": "continuous", "speculative": True}),
}


def _class(name):
    for module, cls, _, _ in STAGES.values():
        if cls == name:
            return getattr(importlib.import_module(module), cls)
    raise KeyError(name)


@pytest.mark.parametrize("chapter", sorted(STAGES))
def test_each_chapter_has_one_stage_module_that_says_what_it_adds_and_lacks(chapter):
    module, cls, parent, _ = STAGES[chapter]
    path = ROOT / (module.replace(".", "/") + ".py")
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc.startswith(f"Chapter {chapter}:"), f"{path.name}'s docstring should open with 'Chapter {chapter}:'"
    assert "Not handled" in doc, f"{path.name}'s docstring should say what it does not handle yet"
    klass = getattr(importlib.import_module(module), cls)
    base = parent if isinstance(parent, type) else _class(parent)
    assert klass.__bases__ == (base,), f"{cls} should add to {base.__name__}, the stage before it"


@pytest.mark.parametrize("chapter", sorted(STAGES))
def test_every_stage_is_selectable_by_name(chapter):
    from minipaged.spec.config import SpeculativeConfig

    module, cls, _, how = STAGES[chapter]
    klass = getattr(importlib.import_module(module), cls)
    if "policy" in how:
        built = make_policy(how["policy"], num_slots=256, block_size=16, max_model_len=128)
    else:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2) if how.get("speculative") else None
        built = make_scheduler(how["scheduler"], make_policy("on_demand", num_slots=256, max_model_len=128),
                               enable_chunked_prefill=how.get("enable_chunked_prefill", False),
                               speculative_config=spec)
    assert type(built) is klass


def _methods_run(call) -> list[str]:
    """Qualified names of the functions in minipaged/kv that run during call(), in first-call order."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and "minipaged" in frame.f_code.co_filename and "/kv/" in frame.f_code.co_filename:
            name = frame.f_code.co_qualname
            if name not in seen:
                seen.append(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_the_default_policys_allocate_and_free_each_read_in_one_method():
    policy = make_policy("prefix_caching", num_slots=64 * 16, block_size=16, max_model_len=512)
    assert type(policy) is PrefixCachingPolicy
    prompt = list(range(40))
    ran = {"allocate": _methods_run(lambda: policy.allocate("a", 40, 20, token_ids=prompt))}
    policy.append_slots("a", 40 - policy.num_tokens("a"))
    policy.commit_tokens("a", prompt)
    ran["free"] = _methods_run(lambda: policy.free("a"))
    for call, names in ran.items():
        policy_methods = [n for n in names if n.split(".")[0].endswith("Policy")]
        same_name = [n for n in policy_methods if n.split(".")[-1] in (call, "_release", "_place")]
        assert same_name == [f"PrefixCachingPolicy.{call}"], (
            f"the default's {call} runs {same_name}: a reader should find it in one method")
    assert "PrefixBlockPool.release" in ran["free"], "free hands the blocks to the pool"
    assert policy.pool.num_free == policy.num_blocks and policy.num_cached_blocks() == 2
    policy.check_invariants()
