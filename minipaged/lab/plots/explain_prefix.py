"""Explanatory figure of chapter 07: the hash chain of full blocks, and the LRU list of cached free blocks.

    trace = trace_prefix_cache()        three requests with one system prompt, through the real engine
                                        core (SyntheticRunner) and PrefixCachingPolicy
    plot_hash_chain(trace, path=...)    one row per request: its full blocks, each named by
                                        (hash of the parent's key, its tokens), the physical block the
                                        cache maps that key to, and whether it was a hit; below, the
                                        blocks nobody holds that the cache can still find, in the
                                        order they would be evicted

Requests A and B run to the end one after the other; C is admitted last and the picture is taken
after its first step, so C holds its blocks while A's and B's unshared blocks wait on the LRU list.
The hashes shown are ``hash(key) % 65536`` in hex. They change from one process to the next (the
first block's key holds None, whose hash is its address before Python 3.12); which blocks share a
key does not.

Not handled: evictions (the pool is large enough that nothing is evicted in this run).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.lab.plots.style import save

SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18]  # a system prompt of two blocks of 4
PREFIX_REQUESTS = [("A", SYSTEM + [21, 22, 23, 24, 25, 26], 3),  # (id, prompt token ids, output tokens)
                   ("B", SYSTEM + [31, 32, 33, 34, 35], 3),
                   ("C", SYSTEM + [21, 22, 23, 24, 41, 42], 3)]
PREFIX_POOL = dict(num_slots=64, block_size=4, max_model_len=64)


@dataclass
class ChainBlock:
    index: int  # logical block of the request
    tokens: list[int]
    key: tuple  # (hash of the parent's key or None, tokens): the policy's BlockKey
    block: int | None  # the physical block the cache maps the key to (None: not cached)
    hit: bool  # found in the cache when the request was admitted (no prefill for it)


@dataclass
class PrefixTrace:
    block_size: int
    chains: dict[str, list[ChainBlock]] = field(default_factory=dict)  # request id -> its full blocks
    lru: list[int] = field(default_factory=list)  # cached blocks nobody holds, first to be evicted first
    lru_keys: dict[int, tuple] = field(default_factory=dict)  # their keys
    held: dict[str, list[int]] = field(default_factory=dict)  # running requests' block tables
    num_plain_free: int = 0  # free blocks that hold nothing the cache knows


def short_hash(key) -> str:
    """A key's hash, cut to 16 bits, for a label."""
    return f"{hash(key) % 65536:04x}"


def trace_prefix_cache(requests=PREFIX_REQUESTS, pool=PREFIX_POOL) -> PrefixTrace:
    from minipaged.kv import make_policy
    from minipaged.kv.prefix_cache import block_keys
    from minipaged.lab.plots.explain_steps import synthetic_core
    from minipaged.sampling_params import SamplingParams

    policy = make_policy("prefix_caching", **pool)
    core = synthetic_core(policy)
    bs = policy.block_size
    trace = PrefixTrace(bs)
    seqs = {}
    for n, (rid, prompt, output_len) in enumerate(requests):
        request = core.add_request(rid, list(prompt), SamplingParams(max_tokens=output_len, ignore_eos=True))
        seqs[rid] = request.seqs[0]
        last = n == len(requests) - 1
        core.step()  # admits it: its cached blocks count as computed
        while not last and core.has_unfinished_requests():
            core.step()
    # the picture: every request's full blocks, named by the same function the policy uses
    for rid, seq in seqs.items():
        # the tokens whose K/V was written (a finished sequence's last token never was)
        tokens = seq.all_ids[:-1] if seq.finished else seq.all_ids[:policy.num_tokens(seq.seq_id)]
        keys = block_keys(tokens, bs)
        hits = seq.num_cached_tokens // bs
        trace.chains[rid] = [ChainBlock(i, list(tokens[i * bs:(i + 1) * bs]), key, policy.pool.lookup(key), i < hits)
                             for i, key in enumerate(keys)]
        if not seq.finished:
            trace.held[rid] = list(policy.block_table(seq.seq_id))
    snap = policy.snapshot()
    trace.lru = list(snap["evictable"])
    trace.lru_keys = {b: policy.pool.key_of(b) for b in trace.lru}
    trace.num_plain_free = policy.num_free_blocks - len(trace.lru)
    while core.has_unfinished_requests():
        core.step()
    core.check_invariants(idle=True)
    return trace


def plot_hash_chain(trace: PrefixTrace, path: str | None = None, title: str | None = None):
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    owners = {}  # physical block -> first request whose chain has it
    for rid, chain in trace.chains.items():
        for b in chain:
            owners.setdefault(b.block, rid)
    palette = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a"]
    color = {rid: palette[i % len(palette)] for i, rid in enumerate(trace.chains)}
    longest = max(len(c) for c in trace.chains.values())
    W, H, GAP = 3.0, 1.3, 1.0
    fig = Figure(figsize=(min(10.0, 0.5 * longest * (W + GAP) + 2.0), 1.3 * len(trace.chains) + 2.3))
    ax = fig.subplots()
    for r, (rid, chain) in enumerate(trace.chains.items()):
        y = -r * 2.2
        state = "running: holds its blocks" if rid in trace.held else "finished"
        ax.text(-0.4, y + H / 2, f"request {rid}\n({state})", ha="right", va="center", fontsize=9)
        for b in chain:
            x = b.index * (W + GAP)
            first = owners[b.block] == rid
            ax.add_patch(Rectangle((x, y), W, H, facecolor=color[owners[b.block]], alpha=0.85 if first else 0.35,
                                   edgecolor="#212121", lw=2.2 if b.hit else 0.8, ls="-" if b.hit or first else "--"))
            parent = "None" if b.key[0] is None else f"{b.key[0] % 65536:04x}"
            ax.text(x + W / 2, y + H * 0.72, f"block {b.block}" + ("  (hit)" if b.hit else ""), ha="center",
                    va="center", fontsize=9, fontweight="bold", color="white" if first else "black")
            ax.text(x + W / 2, y + H * 0.30, f"parent {parent}\ntokens {' '.join(map(str, b.tokens))}",
                    ha="center", va="center", fontsize=8.5, color="white" if first else "black")
            ax.text(x + W / 2, y - 0.12, f"hash {short_hash(b.key)}", ha="center", va="top", fontsize=8.5,
                    family="monospace")
            if b.index > 0:
                ax.add_patch(FancyArrowPatch((x - GAP, y + H / 2), (x, y + H / 2), arrowstyle="-|>",
                                             mutation_scale=10, color="#424242"))
    # the LRU list
    y = -len(trace.chains) * 2.2 - 0.4
    ax.text(-0.4, y + H / 2, "LRU list\n(free, still cached)", ha="right", va="center", fontsize=9)
    for i, block in enumerate(trace.lru):
        x = i * (W * 0.62 + 0.25)
        ax.add_patch(Rectangle((x, y), W * 0.62, H, facecolor=color.get(owners.get(block), "#9e9e9e"), alpha=0.5,
                               edgecolor="#212121"))
        ax.text(x + W * 0.31, y + H / 2, f"block {block}\nhash {short_hash(trace.lru_keys[block])}", ha="center",
                va="center", fontsize=8.5)
    ax.text(0, y - 0.2, f"evicted first  ->  evicted last      (and {trace.num_plain_free} plain free blocks, "
                        "handed out before any of these)", ha="left", va="top", fontsize=9, color="#424242")
    ax.set_xlim(-0.3, max(longest * (W + GAP), len(trace.lru) * (W * 0.62 + 0.25)))
    ax.set_ylim(y - 1.0, H + 0.5)
    ax.axis("off")
    ax.set_title(title or f"Prefix caching: each full block's key is (hash of its parent's key, its "
                          f"{trace.block_size} tokens)", fontsize=11)
    ax.legend(handles=[Patch(facecolor="#bdbdbd", edgecolor="#212121", lw=2.2, label="hit: found in the cache at "
                             "admission"),
                       Patch(facecolor="#bdbdbd", alpha=0.35, edgecolor="#212121", ls="--",
                             label="same block as the row above")],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False, fontsize=9)
    return save(fig, path)
