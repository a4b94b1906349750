"""Runners: what executes one planned step. The scheduler plans (scheduler/), a runner executes the
plan, and the scheduler applies what comes back (``update_from_output``); the engine core (core.py)
only calls the three in turn.

Every runner has the same calls:

    execute(plan) -> StepOutput      make the plan's block copies (swap-outs, swap-ins, copies on
                                     write, in that order), run one forward pass over every planned
                                     token, and return each planned sequence's rows (its last token's,
                                     then one per draft token, chapter 09), in the plan's order
    make_generator(seed)             the random generator a sample draws from (None if it needs none)
    reset()                          forget everything (after an abort of every request)

A ``StepOutput`` is the rows and how to draw from them: ``sample(seq, row)`` draws seq's next token
from one row with seq's own generator and appends it; ``candidates(rows, width, t)`` gives each
beam its 2 * width best (token, logprob). The scheduler draws a row's token only when it uses it, so
a draft (chapter 09) costs one draw per emitted token, as plain decoding does, and a seeded
request gets the same tokens either way.

A runner reads the KV policy (the block tables) and never changes it: the scheduler alone does.

Three runners:

    ModelRunner       the model, the paged K/V tensors (kv/paged_cache.py) and an attention backend.
    PerRequestRunner  chapter 00's memory: a growing K/V tensor per sequence (or none at all with
                      use_cache=False, which recomputes every token at every step).
    SyntheticRunner   no model: every "forward pass" is free and each sequence's next token comes
                      from a function of the sequence (token 7 unless told otherwise). The
                      simulators run the real scheduler and KV policy through the real core with it,
                      in milliseconds; how long a step takes is what it cannot tell.

Not handled: overlapping the block copies with compute, CUDA graphs, sampling on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


class StepRow(NamedTuple):
    """One row of a step's logits, with what sampling needs from it computed for every row at once:
    one log_softmax and one argmax over [rows, V] cost far less than one of each per row."""

    logits: object  # [V]
    logprobs: object  # [V]: log_softmax(logits)
    greedy_token: int  # argmax(logits)


@dataclass
class StepOutput:
    """What a runner returns for one plan: each planned sequence's rows, and how to draw from them."""

    rows: list[list]  # per planned sequence, in plan order: its rows (1 + its draft's length)
    sample: Callable  # sample(seq, row): draw seq's next token from row with seq.generator, append it
    candidates: Callable  # candidates(rows, width, temperature): each beam's 2 * width (token, logprob)


def step_rows(logits) -> list[StepRow]:
    """logits [rows, V] -> one StepRow per row."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [rows, V]
    greedy = logits.argmax(dim=-1).tolist()  # [rows]
    return [StepRow(row, lp, g) for row, lp, g in zip(logits, logprobs, greedy)]


class SyntheticRunner:
    """A runner without a model (see the module docstring). ``token_of(seq) -> int`` gives each
    sequence's next token; the output lengths come from the requests' max_tokens (ignore_eos)."""

    def __init__(self, token_of=None, candidates_of=None):
        self.token_of = token_of or (lambda seq: 7)
        # candidates_of(width) -> a beam's 2 * width (token, logprob), best first (beam search)
        self.candidates_of = candidates_of or (lambda width: [(7 + i, -1.0 - i) for i in range(2 * width)])
        self.last_forward_seconds = 0.0
        self.last_num_tokens = 0  # token positions the last execute computed
        self.num_copies = 0  # block copies the plans asked for (a model runner would make them)

    def make_generator(self, seed):
        return None

    def beam_candidates(self, rows, width: int, temperature: float) -> list[list[tuple[int, float]]]:
        return [self.candidates_of(width) for _ in rows]

    def execute(self, plan) -> StepOutput:
        self.num_copies += len(plan.copies)  # there is no K/V to copy or swap
        self.last_num_tokens = plan.num_tokens
        return StepOutput([[None] * (1 + len(work.draft)) for work in plan.work], self.append_token,
                          self.beam_candidates)

    def append_token(self, seq, row) -> None:
        seq.append(self.token_of(seq), None)

    def reset(self) -> None:
        pass


class ModelRunner:
    """The model over a paged KV pool (see the module docstring)."""

    def __init__(self, model, tokenizer, policy, *, attention_backend: str, cpu_kernels: bool, swap_blocks: int = 0,
                 metrics=None):
        from minipaged.kv.paged_cache import PagedKVCache, SwapKVCache

        cfg = model.config
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.backend = attention_backend
        self.cpu_kernels = cpu_kernels  # the model's small operations compiled (model/kernels.py)
        self.cache = PagedKVCache(cfg, policy.num_blocks, policy.block_size, model.dtype, model.device)
        self.swap_cache = SwapKVCache(cfg, swap_blocks, policy.block_size, model.dtype) if swap_blocks else None
        self.metrics = metrics
        self.last_forward_seconds = 0.0
        self.last_num_tokens = 0  # token positions the last forward pass computed
        self.swap_seconds = 0.0

    def make_generator(self, seed):
        from minipaged.sampling import make_generator

        return make_generator(seed)

    def append_token(self, seq, row) -> None:
        from minipaged.engine import next_token

        next_token(seq, row.logits, seq.generator, self.tokenizer, row.logprobs, row.greedy_token)

    def beam_candidates(self, rows, width: int, temperature: float) -> list[list[tuple[int, float]]]:
        """Each beam's 2 * width most likely (token, logprob), best first (beam_search.py)."""
        import torch

        from minipaged.beam_search import candidate_logprobs

        return candidate_logprobs(torch.stack([row.logits for row in rows]), width, temperature)

    def reset(self) -> None:
        pass  # the K/V tensors stay; the policy's books say nothing in them is anyone's

    # ---- block copies -----------------------------------------------------------------------

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer's K and V (copy-on-write). Within one step no
        destination is also a source, so gathering all sources before writing is the same as copying
        in order."""
        from minipaged.kv.paged_cache import copy_blocks

        copy_blocks(self.cache, self.cache, copies)
        if self.metrics is not None and copies:
            self.metrics.counter("minipaged:block_copies").inc(len(copies))

    def swap_blocks(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Device -> CPU copies first: a device block freed by a swap-out may already be promised to
        someone else in this step, and its old contents must leave before anything lands there."""
        from minipaged.kv.paged_cache import copy_blocks

        if not swap_out and not swap_in:
            return
        start = time.perf_counter()
        copy_blocks(self.cache, self.swap_cache, swap_out)
        copy_blocks(self.swap_cache, self.cache, swap_in)
        self.swap_seconds += time.perf_counter() - start

    # ---- the forward pass ----------------------------------------------------------------------

    def execute(self, plan) -> StepOutput:
        self.swap_blocks(plan.swap_out, plan.swap_in)
        self.copy_blocks(plan.copies)  # before any new K/V lands in a copied block
        rows = []
        if plan.work:
            logits = self.forward([(w.seq.seq_id, w.tokens, w.cached, w.slots) for w in plan.work],
                                  drafts={w.seq.seq_id: len(w.draft) for w in plan.work if w.draft})
            flat, at = step_rows(logits), 0
            for work in plan.work:
                rows.append(flat[at:at + 1 + len(work.draft)])
                at += 1 + len(work.draft)
        return StepOutput(rows, self.append_token, self.beam_candidates)

    def forward(self, work, drafts: dict | None = None):
        """One forward pass. work: [(seq_id, token ids to compute, tokens already cached, their
        slots)] whose slots the scheduler has just planned. Returns logits [rows, V]: each entry's
        last token, or for an entry in ``drafts`` ({seq_id: d}, chapter 09) d + 1 rows (the token
        before the guesses, then each guess)."""
        import torch

        from minipaged.kv.paged_cache import PagedBatch
        from minipaged.model import kernels

        drafts = drafts or {}
        tokens, positions, slots, tables, context_lens, query_lens = [], [], [], [], [], []
        for seq_id, new_tokens, cached, new_slots in work:
            tokens += new_tokens
            positions += range(cached, cached + len(new_tokens))
            slots += new_slots
            tables.append(self.policy.block_table(seq_id))
            context_lens.append(cached + len(new_tokens))
            query_lens.append(len(new_tokens))
        device = self.model.device
        batch = PagedBatch(self.cache, slots, tables, context_lens, query_lens, self.backend)
        ends = torch.tensor(query_lens).cumsum(0)
        last_rows = ends - 1  # each entry's newest token
        if drafts:  # a drafted entry also gives the rows of its own token and every guess (chapter 09)
            last_rows = torch.cat([torch.arange(end - 1 - drafts.get(seq_id, 0), end)
                                   for end, (seq_id, *_) in zip(ends.tolist(), work)])
        start = time.perf_counter()
        with kernels.enabled(self.cpu_kernels):
            logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                batch, logits_rows=last_rows.to(device))  # [rows, V]
        if logits.is_cuda:
            torch.cuda.synchronize()
        self.last_forward_seconds = time.perf_counter() - start
        self.last_num_tokens = len(tokens)
        return logits


class PerRequestRunner(ModelRunner):
    """Chapter 00's memory behind the same core: each sequence keeps its own growing K/V tensors
    (kv/per_request.py), or, with use_cache=False, nothing, and every step recomputes the whole
    sequence (the oracle for caching). Its policy (kv/per_request.py's UnboundedPolicy) only counts
    tokens, and the core runs one sequence at a time, as chapter 00's loop does."""

    def __init__(self, model, tokenizer, policy, *, use_cache: bool, metrics=None):
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.use_cache = use_cache
        self.metrics = metrics
        self.caches: dict = {}
        self.last_forward_seconds = 0.0
        self.last_num_tokens = 0
        self.swap_seconds = 0.0

    def reset(self) -> None:
        self.caches.clear()

    def execute(self, plan) -> StepOutput:
        import torch

        from minipaged.kv.per_request import BatchOfCaches, NoCache, PerRequestKVCache

        layers = self.model.config.num_layers
        for parent, child in plan.copies:  # beam search forked: a private copy of everything
            source, copy = self.caches[parent], PerRequestKVCache(layers)
            copy.k = [t.clone() for t in source.k]
            copy.v = [t.clone() for t in source.v]
            self.caches[child] = copy
        live = set(self.policy.seq_ids())
        for seq_id in [s for s in self.caches if s not in live]:  # finished, pruned or aborted: its K/V goes
            del self.caches[seq_id]
        device = self.model.device
        start = time.perf_counter()
        if not plan.work:
            return StepOutput([], self.append_token, self.beam_candidates)
        if self.use_cache:  # every planned sequence in one forward pass, each through its own cache
            caches = [self.caches.setdefault(w.seq.seq_id, PerRequestKVCache(layers)) for w in plan.work]
            tokens = [t for w in plan.work for t in w.tokens]
            positions = [p for w in plan.work for p in range(w.cached, w.cached + len(w.tokens))]
            lens = [len(w.tokens) for w in plan.work]
            batch = BatchOfCaches(caches, lens) if len(caches) > 1 else caches[0]
            logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device), batch,
                                logits_rows=(torch.tensor(lens).cumsum(0) - 1).to(device))  # [S, V]
            rows = [[row] for row in step_rows(logits)]
            self.last_num_tokens = len(tokens)
        else:  # recompute every sequence from its first token
            rows = []
            for w in plan.work:
                ids = w.seq.all_ids[:w.cached + w.num_own]
                logits = self.model(torch.tensor(ids, dtype=torch.long, device=device),
                                    torch.arange(len(ids), device=device), NoCache(), logits_rows=[len(ids) - 1])
                rows.append(step_rows(logits))  # one row
            self.last_num_tokens = sum(w.cached + w.num_own for w in plan.work)
        self.last_forward_seconds = time.perf_counter() - start
        return StepOutput(rows, self.append_token, self.beam_candidates)
