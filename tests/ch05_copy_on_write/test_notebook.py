"""The chapter's notebook: its hand-written piece still matches the package, and what it says still holds.

The notebook's code cells run here as they are, read from the .ipynb (IPython magics dropped), in one
namespace, with its plotting calls replaced by recorders; nothing is copied out of it. Sections 1-4
(the policy by hand, the re-derived ``blocks_needed``, parallel sampling on the tiny model) take
about a second. Sections 5 and 6 (the real SmolLM2, the sharing simulation) are left to
``python docs/build.py``, which executes the whole notebook.
"""

import contextlib
import io
import json
import random
import re
from pathlib import Path

import pytest

from minipaged.kv import NoFreeMemory, SharedPolicy
from minipaged.lab.simulator import make_workload
from minipaged.lab.simulator.sharing_report import DEFAULT_REQUESTS

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05_copy-on-write.ipynb"
PLOTS = ("plot_block_sharing", "plot_refcount_map", "plot_memory_saved")


def cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def source(cell) -> str:
    return "".join(cell["source"])


def markdown() -> str:
    """The notebook's text, with every run of whitespace (line breaks too) made one space."""
    return " ".join(" ".join(source(c) for c in cells() if c["cell_type"] == "markdown").split())


def run_cells(until: str) -> dict:
    """Execute the code cells in order, up to and including the first one whose source contains
    ``until``. Returns the namespace, with "stdout" (what the cells printed) and "plots" (the
    arguments of every plotting call) added."""
    namespace, plots, out = {}, [], io.StringIO()

    def recorder(name):
        return lambda *args, **kwargs: plots.append((name, args, kwargs))

    for cell in cells():
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        runnable = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))
        with contextlib.redirect_stdout(out):
            exec(compile(runnable, f"{NOTEBOOK.name} cell", "exec"), namespace)
        namespace.update({name: recorder(name) for name in PLOTS})  # the imports cell brings the real ones
        if until in text:
            namespace.update(stdout=out.getvalue(), plots=plots)
            return namespace
    raise AssertionError(f"no code cell of {NOTEBOOK.name} contains {until!r}")


@pytest.fixture(scope="module")
def by_hand():
    """Sections 1-3: the policy by hand, then the cell that defines ``blocks_needed``."""
    return run_cells("def blocks_needed")


@pytest.fixture(scope="module")
def sampling():
    """Section 4: parallel sampling on the tiny model."""
    return run_cells('kv_policy="shared"')


# ---- (a) the re-derived blocks_needed against the package ---------------------------------------

def checked_append(policy, blocks_needed, seq, n) -> bool:
    """Append n tokens to seq, checking first that the notebook's count is what the policy does."""
    snap = policy.snapshot()
    table, tokens = snap["tables"][seq], snap["tokens"][seq]
    new_blocks, copies = blocks_needed(table, snap["refs"], tokens, n, policy.block_size)
    free = policy.num_free_blocks
    fits = new_blocks + copies <= free
    assert policy.can_append_slots(seq, n) == fits, (seq, n, snap, new_blocks, copies, free)
    assert policy.blocks_needed([(seq, n)]) == new_blocks + copies, "the policy's own count for one append"
    if not fits:
        with pytest.raises(NoFreeMemory):
            policy.append_slots(seq, n)
        assert policy.snapshot() == snap, "a refused append changed the bookkeeping"
        return False
    policy.drain_copies()
    policy.append_slots(seq, n)
    after = policy.snapshot()
    assert len(after["tables"][seq]) - len(table) == new_blocks, "new blocks past the end of the table"
    recorded = policy.pending_copies()
    assert len(recorded) == copies, f"copies on write: the notebook says {copies}, the policy recorded {recorded}"
    assert free - policy.num_free_blocks == new_blocks + copies, "free blocks taken"
    for src, dst in recorded:  # each copy replaced a block the sequence shared by a private one
        assert src in table and dst in after["tables"][seq] and after["refs"][dst] == 1
        assert snap["refs"][src] > 1 and policy.ref_count(src) == snap["refs"][src] - 1
    return True


@pytest.mark.parametrize("seed", range(12))
def test_notebook_blocks_needed_matches_the_policy_on_random_states(by_hand, seed):
    """Random admissions (some forked before the prompt is written), forks, appends of 0 to several
    blocks, frees and beam-search steps; before every append the notebook's (new blocks, copies)
    must be what the policy then takes and records, and decide whether it refuses."""
    blocks_needed = by_hand["blocks_needed"]
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 4, 8])
    policy = SharedPolicy(rng.randint(6, 20) * bs, block_size=bs, max_model_len=64 * bs, watermark=0)
    live, next_id, seen = [], 0, {"appended": 0, "refused": 0, "copied": 0, "multi_copy": 0}

    def append(seq, n):
        done = checked_append(policy, blocks_needed, seq, n)
        copies = len(policy.drain_copies()) if done else 0  # what this append recorded
        seen["appended" if done else "refused"] += 1
        seen["copied"] += copies > 0
        seen["multi_copy"] += copies > 1

    for _ in range(300):
        op = rng.random()
        if not live or op < 0.12:  # admit a prompt, sometimes forking it before it is written
            prompt = rng.randint(1, 3 * bs)
            if not policy.can_allocate(prompt, bs):
                if live:
                    policy.free(live.pop(rng.randrange(len(live))))
                continue
            seq, next_id = next_id, next_id + 1
            policy.allocate(seq, prompt, bs)
            live.append(seq)
            family = [seq]
            if rng.random() < 0.3:
                for _ in range(rng.randint(1, 2)):
                    policy.fork(seq, next_id)
                    family.append(next_id)
                    live.append(next_id)
                    next_id += 1
            for member in family:
                append(member, prompt)
        elif op < 0.3:  # fork
            parent = rng.choice(live)
            for _ in range(rng.randint(1, 3)):
                policy.fork(parent, next_id)
                live.append(next_id)
                next_id += 1
        elif op < 0.42:  # a sequence finishes
            policy.free(live.pop(rng.randrange(len(live))))
        elif op < 0.52 and len(live) >= 2:  # a beam step: survivors branch, the rest are pruned
            chosen = [rng.choice(live) for _ in range(rng.randint(1, len(live)))]
            survivors, taken = [], set()
            for parent in chosen:
                if parent in taken:
                    policy.fork(parent, next_id)
                    survivors.append(next_id)
                    next_id += 1
                else:
                    taken.add(parent)
                    survivors.append(parent)
            for beam in [b for b in live if b not in taken]:
                policy.free(beam)
            live = survivors
            for beam in survivors:
                append(beam, 1)
        else:  # append 0, 1, a few, or several blocks' worth of tokens
            append(rng.choice(live), rng.choice([0, 1, 1, 1, 2, bs, 2 * bs + 1]))
        policy.check_invariants()
    for seq in live:
        policy.free(seq)
    assert policy.num_free_blocks == policy.num_blocks
    # the run must have met the cases the count is about, or it proves nothing
    assert seen["appended"] > 50 and seen["copied"] > 5 and seen["multi_copy"] > 0, seen
    if bs > 1:
        assert seen["refused"] > 0, seen


def test_notebook_blocks_needed_counts_every_shared_prompt_block_after_an_early_fork(by_hand):
    """The case the notebook's text singles out: forked before the prompt was written, every prompt
    block the prompt lands in is shared, so every one of them is a copy."""
    blocks_needed = by_hand["blocks_needed"]
    policy = SharedPolicy(16 * 4, block_size=4, max_model_len=64, watermark=0)
    policy.allocate("p", 10, 4)
    policy.fork("p", "q")
    snap = policy.snapshot()
    assert blocks_needed(snap["tables"]["q"], snap["refs"], 0, 10, 4) == (0, 3)
    assert checked_append(policy, blocks_needed, "q", 10)
    assert checked_append(policy, blocks_needed, "p", 10)  # p is the last holder now: in place


# ---- (b) what the notebook's text says about its own cells -------------------------------------

def test_sections_1_and_2_fork_then_copy_on_write_as_the_text_says(by_hand):
    (frames,) = [args[0] for name, args, _ in by_hand["plots"] if name == "plot_block_sharing"]
    fork, b_wrote, all_wrote, a_freed = frames
    # "the same physical blocks, each reference count now 3. Nothing was taken from the free list."
    assert fork["tables"] == {"A": [0, 1], "B": [0, 1], "C": [0, 1]} and fork["refs"] == {0: 3, 1: 3}
    assert fork["tokens"] == {"A": 6, "B": 6, "C": 6} and "free blocks: 10 |" in by_hand["stdout"]
    text = markdown()
    # "sharing() compares the blocks in use (2) with ... (6, the sum of their table lengths)"
    physical = len(fork["refs"])
    logical = sum(len(t) for t in fork["tables"].values())
    assert f"blocks in use ({physical})" in text and f"without sharing ({logical}," in text
    # B's first write: slot 6 is offset 2 of block 1, shared, so it is copied first
    assert "slot 6, that is offset 2 of block 1" in text and 6 // 4 == 1 and 6 % 4 == 2
    assert b_wrote["copies"] == [(1, b_wrote["tables"]["B"][1])] and b_wrote["refs"][1] == 2
    # "Now A appends (block 1 is still shared with C: another copy), then C ... writes in place."
    assert "A's append copies: [(1, " in by_hand["stdout"]
    assert "C's append copies: [] " in by_hand["stdout"] and all_wrote["tables"]["C"] == [0, 1]
    # "a block goes back to the free list only at zero (block 3, A's private copy). Block 0 still
    # has two holders."
    assert "(block 3, A's private copy)" in text and all_wrote["tables"]["A"] == [0, 3]
    assert 3 not in a_freed["refs"] and a_freed["refs"][0] == 2
    assert by_hand["pool"].num_free_blocks == 12 - 3


def test_a_refused_copy_on_write_changes_nothing(by_hand):
    out = by_hand["stdout"]
    assert re.search(r"NoFreeMemory: seq 'b' needs 0 new block\(s\) and 1 copy-on-write block\(s\)", out), out
    assert "unchanged: True" in out


def test_section_4_parallel_sampling_as_the_text_says(sampling):
    out = sampling["stdout"]
    assert "same tokens as 4 separate requests per prompt: True" in out
    prompts, params = sampling["prompts"], sampling["params"]
    prompt_tokens, n = sum(len(p) for p in prompts), params.n
    decode = len(prompts) * n * (params.max_tokens - 1)  # the first token comes from the prefill's logits
    from minipaged.metrics_reader import find

    shared, unshared = sampling["shared"], sampling["unshared"]
    computed = {name: find(llm.get_metrics(), "tokens_computed").value for name, llm in
                (("shared", shared), ("unshared", unshared))}
    assert computed["shared"] == prompt_tokens + decode
    assert computed["unshared"] == n * prompt_tokens + decode
    copies = find(shared.get_metrics(), "block_copies").value
    assert shared.engine.stats["forks"] == copies == len(prompts) * (n - 1)
    bs = sampling["shared"].engine.policy.block_size
    assert all(len(p) % bs for p in prompts), "each prompt must end in a partly filled block"
    text = markdown()
    assert f"({prompt_tokens} prompt tokens instead of {n} x {prompt_tokens})" in text
    assert f"({' and '.join(str(len(p)) for p in prompts)} tokens in blocks of {bs})" in text
    rec = sampling["rec"]  # the notebook's recorder of the shared run's forward passes
    assert sum(rec.series("blocks_physical")) < sum(rec.series("blocks_logical"))


def test_section_6_facts_the_text_states():
    text = markdown()
    assert f"({DEFAULT_REQUESTS} requests, both traces)" in text
    prompts = [r.prompt_len for r in make_workload("alpaca", 100, arrival_rate=1.0, seed=0)]
    mean = sum(prompts) / len(prompts)
    assert "(19 tokens on average, about one block)" in text and 18.5 <= mean < 19.5, mean
    code = "\n".join(source(c) for c in cells() if c["cell_type"] == "code")
    assert "num_requests=100" in code and "100 requests here" in text
