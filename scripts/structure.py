"""Who owns what, measured: the engine runs under a profiler (the tiny model, default options) and this
prints four figures of its structure (docs/pages/architecture.md quotes them):

    PYTHONPATH=$PWD python scripts/structure.py          # this checkout
    PYTHONPATH=/path/to/other/checkout python scripts/structure.py   # another commit, to compare

  files: minipaged files whose functions run while one request goes from LLM.generate to its output
         (after a warm-up request, so lazy imports do not count);
  parties: the files that call the KV policy's (or its block pool's) mutating methods, the policy's
           own calls left out (over a plain request, n=3 parallel sampling, a beam search,
           speculative decoding, and preemption by swap);
  per step: the distinct scheduler methods the core calls while a step runs (from core.py);
  step lines: inspect.getsource(EngineCore.step).

It probes with getattr on purpose: it must measure older commits too, whose parts declared less.

Not handled: what runs in the server's threads (chapter 11); that path adds the async engine.
"""
import collections
import inspect
import os
import sys

import minipaged
from minipaged import LLM, SamplingParams
from minipaged.core import EngineCore
from minipaged.sampling_params import BeamSearchParams

root = os.path.dirname(minipaged.__file__)
top = os.path.dirname(root)
MUT = {"allocate", "append_slots", "commit_tokens", "fork", "free", "truncate", "drain_copies", "detach", "attach",
       "attach_swapped", "release", "take", "share", "reuse"}


def rel(f):
    return os.path.relpath(f, top)



def in_step(frame) -> bool:
    """Whether frame is EngineCore.step, or called from it."""
    while frame is not None:
        if frame.f_code.co_name == "step" and frame.f_code.co_filename.endswith("core.py"):
            return True
        frame = frame.f_back
    return False


def trace(llm, fn):
    files, callers, sched = set(), collections.defaultdict(set), collections.Counter()
    policy, scheduler = llm.engine.policy, llm.engine.core.scheduler
    pools = {id(getattr(policy, "pool", None))}
    def prof(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(root) or frame.f_code.co_name == "<module>":
            return
        files.add(rel(f))
        name, caller = frame.f_code.co_name, frame.f_back
        cf = caller.f_code.co_filename if caller else ""
        me = frame.f_locals.get("self")
        them = caller.f_locals.get("self") if caller else None
        if name in MUT and (me is policy or id(me) in pools) and not (them is policy or id(them) in pools):
            callers[f"{type(me).__name__}.{name}"].add(rel(cf))
        if me is scheduler and cf.endswith("core.py") and in_step(caller):
            sched[name] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files, callers, sched


greedy = SamplingParams(temperature=0, max_tokens=8)
llm = LLM("tiny", progress=False)
llm.generate(["warm up"], greedy, use_tqdm=False)
files, callers, sched = trace(llm, lambda: llm.generate(["The capital of France is"], greedy, use_tqdm=False))
print("files on one request's path:", len(files))
for f in sorted(files):
    print("   ", f)
runs = [(llm, lambda: llm.generate(["The sea"], SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=8),
                                   use_tqdm=False)),
        (llm, lambda: llm.beam_search(["The sea"], BeamSearchParams(beam_width=3, max_tokens=6)))]
spec = LLM("tiny", progress=False, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
runs.append((spec, lambda: spec.generate(["a b a b a b a b"], SamplingParams(temperature=0, max_tokens=12),
                                         use_tqdm=False)))
swap = LLM("tiny", progress=False, kv_policy="on_demand", kv_capacity_tokens=96, block_size=4, max_model_len=96,
           preemption_mode="swap")
runs.append((swap, lambda: swap.generate([[1, 2, 3], [7, 8, 9, 10], [42] * 20, list(range(30, 70))],
                                         SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                                         use_tqdm=False)))
allc, alls = collections.defaultdict(set), collections.Counter(sched)
for k, v in callers.items():
    allc[k] |= v
for engine, fn in runs:
    _, c, s = trace(engine, fn)
    for k, v in c.items():
        allc[k] |= v
    alls.update(s)
print("calls to the policy's (or its pool's) mutating methods from anything but the policy itself:")
for k, v in sorted(allc.items()):
    print("   ", k, sorted(v))
print("  parties (files):", sorted(set().union(*allc.values())))
print("scheduler methods EngineCore.step calls:", sorted(alls))
print("EngineCore.step lines:", len(inspect.getsource(EngineCore.step).splitlines()))
