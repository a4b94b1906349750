"""Chapter 00's runner: the same core, but each sequence keeps its own growing K/V tensors.

``PerRequestRunner`` has the runner's interface (runner.py: ``execute(plan) -> RunnerOutput``,
``make_generator``, ``reset``) over kv/per_request.py's per-sequence caches instead of a paged pool,
or over no cache at all (``use_cache=False``: every step recomputes every sequence from its first
token, the oracle that caching must agree with). ``LLM(kv_policy="per_request")`` builds it.

Not handled: a pool (memory is unbounded), sharing (a beam that branches copies its parent's tensors
whole), swapping, drafts.
"""
from __future__ import annotations

import time

import torch

from minipaged.kv.per_request import BatchOfCaches, NoCache, PerRequestKVCache
from minipaged.runner import sampled_output
from minipaged.sampling import make_generator
from minipaged.step import RunnerOutput


class PerRequestRunner:
    """Chapter 00's memory behind the same core: each sequence keeps its own growing K/V tensors
    (kv/per_request.py), or, with use_cache=False, nothing, and every step recomputes the whole
    sequence (the oracle for caching). Its policy (kv/per_request.py's UnboundedPolicy) only counts
    tokens; a fork (a beam that branches) copies the parent's tensors whole."""

    def __init__(self, model, policy, *, use_cache: bool):
        self.model, self.policy, self.use_cache = model, policy, use_cache
        self.caches: dict = {}  # seq_id -> its PerRequestKVCache

    def make_generator(self, seed):
        return make_generator(seed)

    def reset(self) -> None:
        self.caches.clear()

    def execute(self, plan) -> RunnerOutput:
        layers = self.model.config.num_layers
        for parent, child in plan.copies:  # a fork: a private copy of everything
            source, copy = self.caches[parent], PerRequestKVCache(layers)
            copy.k = [t.clone() for t in source.k]
            copy.v = [t.clone() for t in source.v]
            self.caches[child] = copy
        live = set(self.policy.seq_ids())
        for seq_id in [s for s in self.caches if s not in live]:  # finished, pruned or aborted: its K/V goes
            del self.caches[seq_id]
        if not plan.work:
            return RunnerOutput([])
        device = self.model.device
        start = time.perf_counter()
        if self.use_cache:  # every planned sequence in one forward pass, each through its own cache
            caches = [self.caches.setdefault(w.seq.seq_id, PerRequestKVCache(layers)) for w in plan.work]
            tokens = [t for w in plan.work for t in w.tokens]
            positions = [p for w in plan.work for p in range(w.cached, w.cached + len(w.tokens))]
            lens = [len(w.tokens) for w in plan.work]
            batch = BatchOfCaches(caches, lens) if len(caches) > 1 else caches[0]
            logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device), batch,
                                logits_rows=(torch.tensor(lens).cumsum(0) - 1).to(device))  # [S, V]
            computed = len(tokens)
        else:  # recompute every sequence from its first token
            last = []
            for w in plan.work:
                ids = w.seq.all_ids[:w.cached + w.num_own]
                last.append(self.model(torch.tensor(ids, dtype=torch.long, device=device),
                                       torch.arange(len(ids), device=device), NoCache(), logits_rows=[len(ids) - 1]))
            logits = torch.cat(last)  # [S, V]
            computed = sum(w.cached + w.num_own for w in plan.work)
        return sampled_output(plan, logits, computed, time.perf_counter() - start)
