"""``/dashboard``: the KV pool live, while requests stream.

    GET /dashboard          one self-contained HTML page (no CDN: it works offline)
    GET /dashboard/state    what the page draws, as JSON, polled a few times a second

``pool_state`` runs on the engine thread between two steps (``AsyncLLMEngine.inspect``), so the
books it reads are consistent: every block of the pool with the request that holds it, its
reference count (a block shared by forked samples or by a cached prefix is held several times),
how many of its slots hold tokens, and whether the prefix cache can still find it once it is free;
each running request's block table (logical block i -> physical block); the waiting, running and
swapped queues; and the KV usage over the last minutes.

The page (dashboard.html, beside this file) draws the pool as a grid of cells, one per block,
coloured by the owning request: a strong colour for slots that hold tokens, a pale one for slots a
reserving policy set aside, a number for a block with more than one holder, a hatched grey cell
for a free block the prefix cache still knows. For the contiguous arena (chapter 01) a cell is one
token slot.

Not handled yet: the swap space's blocks (only how many requests sit there), per-layer views.
"""

from __future__ import annotations

import time
from importlib import resources


def page() -> str:
    return resources.files("minipaged.server").joinpath("dashboard.html").read_text(encoding="utf-8")


def pool_state(llm_engine, usage_history=()) -> dict:
    """Plain data about the pool and the queues of ``llm_engine`` (an LLMEngine), for the page."""
    core = llm_engine.core
    policy, scheduler, args = core.policy, core.scheduler, llm_engine.args
    request_of = {}
    for request_id, request in core.requests.items():
        for seq in [*request.samples, *request.seqs]:  # the samples, and a beam search's live beams
            request_of[seq.seq_id] = request_id
    state = {"time": time.time(), "kv_policy": args.kv_policy, "scheduler": args.scheduler,
             "kv_cache_usage": core.kv_cache_usage(), "usage_history": [list(p) for p in usage_history],
             "queues": {"waiting": _queue(scheduler.waiting), "running": _queue(scheduler.running),
                        "swapped": _queue(scheduler.swapped)}}
    if not args.pooled:  # chapter 00: private tensors, no pool to draw
        state.update(num_blocks=0, block_size=0, blocks=[], requests=[])
        return state
    unit = 1 if args.kv_policy == "contiguous" else policy.block_size
    num_cells = policy.num_slots // unit
    owner: list = [None] * num_cells
    refs = [0] * num_cells
    fill = [0] * num_cells
    requests: dict[str, dict] = {}
    for seq_id in policy.seq_ids():
        request_id = request_of.get(seq_id, str(seq_id))
        held = list(policy.allocated_blocks(seq_id))
        tokens = policy.num_tokens(seq_id)
        for i, block in enumerate(held):
            refs[block] += 1
            if owner[block] is None:
                owner[block] = request_id
            fill[block] = max(fill[block], min(max(tokens - i * unit, 0), unit))
        requests.setdefault(request_id, {"request_id": request_id, "seqs": []})["seqs"].append(
            {"seq_id": seq_id, "num_tokens": tokens,
             # the arena's "table" is one slab: its first slot and its size
             **({"block_table": list(policy.block_table(seq_id))} if unit > 1 else
                {"slab": [held[0], len(held)] if held else []})})
    cached = [False] * num_cells
    if policy.caches_prefixes:
        pool = policy.pool
        cached = [pool.key_of(b) is not None for b in range(num_cells)]
    for queue, ids in state["queues"].items():
        for request_id in ids:
            if request_id in requests:
                requests[request_id]["status"] = queue
    state.update(num_blocks=num_cells, block_size=unit, owner=owner, refs=refs, fill=fill, cached=cached,
                 requests=list(requests.values()),
                 counts={"held": sum(r > 0 for r in refs), "shared": sum(r > 1 for r in refs),
                         "cached_free": sum(c and r == 0 for c, r in zip(cached, refs)),
                         "free": sum(r == 0 for r in refs)})
    return state


def _queue(requests) -> list[str]:
    """The ids of the requests in one of the scheduler's queues (a request split in parts once)."""
    ids = []
    for request in requests:
        if request.request_id not in ids:
            ids.append(request.request_id)
    return ids
