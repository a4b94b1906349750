"""Explanatory figures of chapters 06, 08 and 09, drawn from the real engine core's steps.

Each figure has two halves: a ``trace_*`` function that runs a small, fixed set of requests through
``EngineCore`` with the ``SyntheticRunner`` (no model: the scheduler, the KV policy and the loop are
the ones that serve SmolLM2) and returns plain data, and a ``plot_*`` function that draws that data.
The tests check the data against the engine's own books, so a figure cannot drift from the code.

    trace_continuous() / plot_request_states(trace)   chapter 06: one row per request, one column per
                                                      step, coloured by what the scheduler did with it
                                                      (waiting, prefill, decode, preempted, finished)
    trace_chunked() / plot_chunk_packing(trace)       chapter 08: each step's tokens per request,
                                                      decodes first, then prompt chunks, under the budget
    trace_speculative() / plot_spec_rollback(trace)   chapter 09: one request's block table before a
                                                      step, with its draft's slots, and after verification

How the traces look inside a step: the runner's ``execute`` is wrapped, so the trace sees the plan
after the scheduler made it (slots handed out, drafts appended) and before the output is applied.
Nothing in the engine changes.

Not handled: swapped-out requests in the chapter 06 figure (its run preempts by recompute; a
swapped request would show as "waiting"), several samples per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.lab.plots.style import save

# ---- running the engine core step by step ------------------------------------------------------


def synthetic_core(policy, *, scheduler: str = "continuous", max_num_seqs: int = 8,
                   max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = False,
                   speculative_config: dict | None = None, token_of=None, proposer=None):
    """An EngineCore over ``policy`` with the SyntheticRunner (token_of(seq) gives each next token)."""
    from minipaged.config import EngineArgs
    from minipaged.core import EngineCore
    from minipaged.lab.simulator.runner import SyntheticRunner

    args = EngineArgs(model="synthetic", kv_policy=policy.name, block_size=policy.block_size,
                      kv_capacity_tokens=policy.num_slots, scheduler=scheduler, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
                      speculative_config=speculative_config).validate()
    return EngineCore(args, policy, SyntheticRunner(token_of), None, None, policy.max_model_len, proposer=proposer)


def watch_plans(core, look=None) -> list:
    """Make the core's runner append, for each plan it executes, ``look(plan)`` (default: the plan's
    work as (seq_id, tokens, is_prefill, completes) tuples) to the list returned. It is called after
    the scheduler planned the step and before its output is applied, which changes the sequences.
    ``del core.runner.execute`` stops it."""
    looks, execute = [], core.runner.execute
    look = look or (lambda plan: [(w.seq.seq_id, w.num_new, w.is_prefill, w.completes) for w in plan.work])

    def recording_execute(plan):
        looks.append(look(plan))
        return execute(plan)

    core.runner.execute = recording_execute
    return looks


# ---- chapter 06: the queues, step by step --------------------------------------------------------

# (request id, arrival step, prompt tokens, output tokens): six requests into a pool of 12 blocks of 4,
# so the running batch outgrows the pool and the newest request is preempted (recompute).
CONTINUOUS_REQUESTS = [("A", 0, 6, 9), ("B", 0, 5, 11), ("C", 1, 7, 6), ("D", 2, 4, 12), ("E", 4, 8, 5),
                       ("F", 6, 3, 4)]
CONTINUOUS_POOL = dict(num_slots=48, block_size=4, max_model_len=64)

STATES = ("waiting", "prefill", "decode", "preempted", "finished")


@dataclass
class StepTrace:
    """What the scheduler did with each request at each step (a state from STATES, or "" before it
    arrived), and the pool as the step's forward pass saw it."""

    requests: list[str]
    states: list[dict[str, str]] = field(default_factory=list)  # per step: request id -> state
    blocks_used: list[int] = field(default_factory=list)  # per step: blocks held during the forward pass
    num_blocks: int = 0
    queues: list[dict[str, int]] = field(default_factory=list)  # per step: waiting / running after planning
    stats: dict = field(default_factory=dict)  # the scheduler's tallies at the end (preemptions, ...)


def trace_continuous(requests=CONTINUOUS_REQUESTS, pool=CONTINUOUS_POOL, max_num_seqs: int = 8) -> StepTrace:
    """Run ``requests`` (id, arrival step, prompt len, output len) through chapter 06's scheduler with
    an on-demand policy, and record every request's state at every step."""
    from minipaged.kv import make_policy
    from minipaged.sampling_params import SamplingParams
    from minipaged.scheduler import RequestStatus

    policy = make_policy("on_demand", watermark=0, **pool)
    core = synthetic_core(policy, max_num_seqs=max_num_seqs)
    trace = StepTrace([r[0] for r in requests], num_blocks=policy.num_blocks, stats=core.stats)

    def look(plan):  # the step's work, the pool and the queues between planning and applying
        trace.blocks_used.append(policy.num_blocks - policy.num_free_blocks)
        trace.queues.append({"waiting": len(core.scheduler.waiting), "running": len(core.scheduler.running)})
        return {w.seq.seq_id: ("prefill" if w.is_prefill else "decode") for w in plan.work}

    plans = watch_plans(core, look)
    step = 0
    while step == 0 or core.has_unfinished_requests() or any(a >= step for _, a, _, _ in requests):
        for rid, arrival, prompt_len, output_len in requests:
            if arrival == step:
                core.add_request(rid, [1] * prompt_len, SamplingParams(max_tokens=output_len, ignore_eos=True))
        running_before = {rid for rid, r in core.requests.items() if r.status is RequestStatus.RUNNING}
        core.step()
        kind = plans[-1]
        row = {}
        for rid in trace.requests:
            request = core.requests.get(rid)
            if request is None:
                row[rid] = ""
            elif request.seqs and request.seqs[0].seq_id in kind:
                row[rid] = kind[request.seqs[0].seq_id]
            elif rid in running_before and request.status is RequestStatus.WAITING:
                row[rid] = "preempted"
            elif request.finished:
                row[rid] = "finished"
            else:
                row[rid] = "waiting"
        trace.states.append(row)
        step += 1
    del core.runner.execute
    core.check_invariants(idle=True)
    return trace


STATE_COLORS = {"waiting": "#fff3c4", "prefill": "#1565c0", "decode": "#64b5f6", "preempted": "#c62828",
                "finished": "#eeeeee", "": "#ffffff"}


def plot_request_states(trace: StepTrace, path: str | None = None, title: str | None = None):
    """One row per request, one column per step, coloured by state; below, the blocks held per step."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    n_steps, n_req = len(trace.states), len(trace.requests)
    fig = Figure(figsize=(max(8.0, 0.32 * n_steps + 2), 0.42 * n_req + 3.2))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [n_req, 2.4], "hspace": 0.12})
    for s, row in enumerate(trace.states):
        for i, rid in enumerate(trace.requests):
            state = row[rid]
            if state == "finished" and s > 0 and trace.states[s - 1][rid] == "finished":
                continue  # only the step it finished in is drawn
            if state:
                ax.add_patch(Rectangle((s, i), 1, 1, facecolor=STATE_COLORS[state], edgecolor="white", lw=1))
            if state == "preempted":
                ax.text(s + 0.5, i + 0.5, "P", ha="center", va="center", color="white", fontsize=9,
                        fontweight="bold")
    ax.set_xlim(0, n_steps)
    ax.set_ylim(n_req, 0)
    ax.set_yticks([i + 0.5 for i in range(n_req)], [f"request {r}" for r in trace.requests])
    ax.set_title(title or "Continuous batching: what the scheduler does with each request, step by step")
    ax.legend(handles=[Patch(facecolor=STATE_COLORS[s], edgecolor="#999999", label=s) for s in STATES],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    steps = [s + 0.5 for s in range(n_steps)]
    ax2.bar(steps, trace.blocks_used, width=0.8, color="#78909c", label="blocks held")
    ax2.axhline(trace.num_blocks, color="#c62828", ls="--", lw=1.2, label=f"pool: {trace.num_blocks} blocks")
    ax2.set_ylabel("KV blocks")
    ax2.set_ylim(0, trace.num_blocks * 1.25)
    ax2.set_xlabel("engine step (one forward pass each)")
    ax2.set_xticks(range(0, n_steps + 1, 5))
    ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    return save(fig, path)


# ---- chapter 08: chunks under the token budget ---------------------------------------------------

# Two short requests decode while two long prompts arrive; the budget is 16 tokens a step.
CHUNKED_REQUESTS = [("A", 0, 6, 14), ("B", 0, 5, 14), ("C", 2, 37, 4), ("D", 3, 22, 4)]
CHUNKED_POOL = dict(num_slots=256, block_size=4, max_model_len=128)
CHUNKED_BUDGET = 16


@dataclass
class ChunkTrace:
    """Per step, the plan's work in plan order: (request id, tokens, "decode" / "chunk" / "last chunk")."""

    requests: list[str]
    budget: int
    steps: list[list[tuple[str, int, str]]] = field(default_factory=list)


def trace_chunked(requests=CHUNKED_REQUESTS, pool=CHUNKED_POOL, budget: int = CHUNKED_BUDGET) -> ChunkTrace:
    """Run ``requests`` (id, arrival step, prompt len, output len) through chapter 08's scheduler."""
    from minipaged.kv import make_policy
    from minipaged.sampling_params import SamplingParams

    policy = make_policy("on_demand", watermark=0, **pool)
    core = synthetic_core(policy, max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=True)
    plans = watch_plans(core)
    trace = ChunkTrace([r[0] for r in requests], budget)
    owner: dict[int, str] = {}
    step = 0
    while step == 0 or core.has_unfinished_requests() or any(a >= step for _, a, _, _ in requests):
        for rid, arrival, prompt_len, output_len in requests:
            if arrival == step:
                request = core.add_request(rid, [1] * prompt_len, SamplingParams(max_tokens=output_len,
                                                                                  ignore_eos=True))
                owner[request.seqs[0].seq_id] = rid
        before = len(plans)
        core.step()
        if len(plans) > before and plans[-1]:
            trace.steps.append([(owner[seq_id], n, "decode" if not prefill else "last chunk" if completes else "chunk")
                                for seq_id, n, prefill, completes in plans[-1]])
        step += 1
    del core.runner.execute
    core.check_invariants(idle=True)
    return trace


REQUEST_COLORS = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457"]


def plot_chunk_packing(trace: ChunkTrace, path: str | None = None, title: str | None = None):
    """Per step, a stack of the tokens each request computes (decodes at the bottom, then the prompt
    chunks), under the budget line."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    color = {rid: REQUEST_COLORS[i % len(REQUEST_COLORS)] for i, rid in enumerate(trace.requests)}
    fig = Figure(figsize=(max(8.0, 0.34 * len(trace.steps) + 2.5), 4.2))
    ax = fig.subplots()
    for s, work in enumerate(trace.steps):
        bottom = 0
        for rid, tokens, kind in work:
            hatch = None if kind == "decode" else ("//" if kind == "chunk" else "..")
            ax.bar(s, tokens, bottom=bottom, width=0.8, color=color[rid], alpha=1.0 if kind == "decode" else 0.55,
                   edgecolor="white", hatch=hatch, lw=0.6)
            if tokens >= 3:
                ax.text(s, bottom + tokens / 2, f"{rid}\n{tokens}", ha="center", va="center", fontsize=8,
                        color="black" if kind != "decode" else "white")
            bottom += tokens
    ax.axhline(trace.budget, color="#c62828", ls="--", lw=1.2)
    ax.text(len(trace.steps) - 0.5, trace.budget + 0.3, f"token budget {trace.budget}", color="#c62828",
            ha="right", va="bottom", fontsize=9)
    ax.set_ylim(0, trace.budget * 1.3)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlim(-0.6, len(trace.steps) - 0.4)
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens computed in the step")
    ax.set_title(title or "Chunked prefill: decodes first (solid), then prompt chunks (hatched) fill the budget")
    handles = [Patch(facecolor=color[r], label=f"request {r}") for r in trace.requests]
    handles += [Patch(facecolor="#bdbdbd", label="decode (1 token)"),
                Patch(facecolor="#bdbdbd", alpha=0.55, hatch="//", label="prompt chunk"),
                Patch(facecolor="#bdbdbd", alpha=0.55, hatch="..", label="last chunk (samples)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    return save(fig, path)


# ---- chapter 09: draft, verify, roll back --------------------------------------------------------

SPEC_PROMPT = [5, 6, 7, 8, 9]  # prompt tokens of the one request
SPEC_K = 4  # draft tokens per step
SPEC_POOL = dict(num_slots=64, block_size=4, max_model_len=64)


def spec_true_token(seq) -> int:
    """The synthetic model's next token: counts up from the prompt's last token, 10, 11, 12, ..."""
    return 5 + seq.num_tokens


def spec_proposer(seq, k: int) -> list[int]:
    """A draft that is right for its first two guesses and wrong after (so a step of k = 4 guesses
    keeps 2, emits a correction, and rolls back 2 slots)."""
    right = [5 + seq.num_tokens + j for j in range(k)]
    return right[:2] + [0] * (k - 2)


@dataclass
class SpecFrame:
    """One request's block table at one moment: which blocks, how many tokens have slots, and which of
    those slots hold draft tokens (their positions, and whether verification kept them)."""

    label: str
    blocks: list[int]
    num_tokens: int
    draft_positions: list[int] = field(default_factory=list)
    accepted: int = 0  # how many of the draft's guesses verification kept (the first ones)


@dataclass
class SpecTrace:
    block_size: int
    tokens: list[int]  # the sequence's tokens at the end of the traced step
    frames: list[SpecFrame]
    draft: list[int]
    emitted: list[int]  # the tokens the step emitted (accepted guesses, then the model's own)
    freed_blocks: list[int]  # blocks the rollback gave back to the pool


def trace_speculative(k: int = SPEC_K, decode_steps: int = 2, pool=SPEC_POOL) -> SpecTrace:
    """One request through chapter 09's scheduler with a draft that gets guesses 3.. wrong: its block
    table before the step, with the draft's slots, and after verification, for the step after
    ``decode_steps`` steps (the prefill and the first decodes)."""
    from minipaged.kv import make_policy
    from minipaged.sampling_params import SamplingParams

    policy = make_policy("on_demand", watermark=0, **pool)
    core = synthetic_core(policy, speculative_config={"method": "ngram", "num_speculative_tokens": k},
                          token_of=spec_true_token, proposer=spec_proposer)
    plans = watch_plans(core, lambda plan: [(w.cached, w.num_new, list(w.draft), list(policy.block_table(w.seq.seq_id)))
                                            for w in plan.work])
    request = core.add_request("R", list(SPEC_PROMPT), SamplingParams(max_tokens=24, ignore_eos=True))
    seq = request.seqs[0]
    for _ in range(decode_steps):
        core.step()
    bs = policy.block_size
    before = SpecFrame("before the step", list(policy.block_table(seq.seq_id)), policy.num_tokens(seq.seq_id))
    outputs_before = len(seq.output_ids)
    core.step()
    ((cached, num_new, draft, planned_table),) = plans[-1]
    planned_tokens = cached + num_new
    drafted = SpecFrame(f"planned: 1 token + {len(draft)} draft tokens", planned_table, planned_tokens,
                        list(range(planned_tokens - len(draft), planned_tokens)))
    emitted = seq.output_ids[outputs_before:]
    accepted = len(emitted) - 1
    drafted.accepted = accepted
    after_blocks = list(policy.block_table(seq.seq_id))
    after = SpecFrame(f"after verification: {accepted} kept, {len(draft) - accepted} rolled back",
                      after_blocks, policy.num_tokens(seq.seq_id), drafted.draft_positions[:accepted], accepted)
    freed = [b for b in drafted.blocks if b not in after_blocks]
    del core.runner.execute
    return SpecTrace(bs, list(seq.all_ids), [before, drafted, after], draft, emitted, freed)


def plot_spec_rollback(trace: SpecTrace, path: str | None = None, title: str | None = None):
    """Three rows: the block table before the step, with the draft's slots, after verification."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    bs = trace.block_size
    width = max(len(f.blocks) for f in trace.frames)
    fig = Figure(figsize=(max(8.0, 1.5 * width + 3), 1.25 * len(trace.frames) + 1.2))
    ax = fig.subplots()
    colors = {"token": "#2e7d32", "new": "#81c784", "kept": "#1565c0", "rejected": "#c62828", "empty": "#f5f5f5"}
    for row, frame in enumerate(trace.frames):
        y = -row * 1.6
        ax.text(-0.2, y + 0.5, frame.label, ha="right", va="center", fontsize=9)
        for b, block in enumerate(frame.blocks):
            x0 = b * (bs + 0.6)
            for s in range(bs):
                pos = b * bs + s
                if pos >= frame.num_tokens:
                    kind = "empty"
                elif pos in frame.draft_positions:
                    kind = "kept" if frame.draft_positions.index(pos) < frame.accepted else "rejected"
                    if row == len(trace.frames) - 1:
                        kind = "kept"
                elif row > 0 and pos >= trace.frames[0].num_tokens:
                    kind = "new"
                else:
                    kind = "token"
                ax.add_patch(Rectangle((x0 + s, y), 1, 1, facecolor=colors[kind], edgecolor="white", lw=1.5))
                if pos < frame.num_tokens:
                    ax.text(x0 + s + 0.5, y + 0.5, str(pos), ha="center", va="center", fontsize=9,
                            color="white" if kind != "new" else "black")
            ax.add_patch(Rectangle((x0, y), bs, 1, fill=False, edgecolor="#424242", lw=1.2))
            ax.text(x0 + bs / 2, y + 1.12, f"block {block}", ha="center", va="bottom", fontsize=9)
        if row == 1:
            for block in trace.freed_blocks:
                b = frame.blocks.index(block)
                ax.text(b * (bs + 0.6) + bs / 2, y - 0.15, "given back after verification", ha="center",
                        va="top", fontsize=8, color="#c62828")
    ax.set_xlim(-0.2, width * (bs + 0.6))
    ax.set_ylim(-1.6 * (len(trace.frames) - 1) - 0.6, 1.7)
    ax.axis("off")
    ax.set_title(title or f"Speculative decoding on a block table (blocks of {bs}; cells are token positions)\n"
                          f"draft {trace.draft}, emitted {trace.emitted}", fontsize=10)
    ax.legend(handles=[Patch(facecolor=colors["token"], label="token with K/V"),
                       Patch(facecolor=colors["new"], label="the step's own token"),
                       Patch(facecolor=colors["kept"], label="draft token, accepted"),
                       Patch(facecolor=colors["rejected"], label="draft token, rejected"),
                       Patch(facecolor=colors["empty"], edgecolor="#999999", label="free slot")],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, frameon=False, fontsize=9)
    return save(fig, path)
