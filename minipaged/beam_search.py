"""Beam search (chapter 05), in the shape of vLLM's ``LLM.beam_search``, with beams that share blocks.

    from minipaged.beam_search import BeamSearchParams
    outs = llm.beam_search(["The sea is"], BeamSearchParams(beam_width=4, max_tokens=16))
    outs[0].sequences[0].text, .tokens (prompt + output), .cum_logprob

The search, per request, one step per generated token:

    beams = [the prompt]                                   cum_logprob 0
    repeat max_tokens times:
        logits of every live beam (of every request) in one forward pass
        candidates: each beam's 2 * beam_width most likely next tokens, cum_logprob + logprob
        a candidate ending in EOS is complete (unless ignore_eos); the others are ranked by score
        and the best beam_width become the new beams
    answer: the best beam_width of (complete + live) by score = cum_logprob / len(tokens) ** length_penalty

What happens to memory at each step is the point of the chapter. A new beam is its parent plus one
token, so its K/V is the parent's: the first new beam of a parent takes the parent's blocks over,
every further one forks them (reference counts + 1, nothing copied), and a parent no new beam chose
is freed (pruned). Next step, each beam appends its token; a beam whose last block is still shared
copies that block first (copy-on-write). Beams therefore hold one copy of their common prefix.

Two memory backends run the same search:
    PagedBeams    the paged engine with the "shared" KV policy (the thing being taught);
    PrivateBeams  every beam owns private K/V tensors, cloned in full when a beam branches: a plain
                  beam search without any sharing, the oracle. It batches the beams exactly as the
                  paged one does, so the two compute the same floating-point numbers.

Differences from vLLM, on purpose: candidates are the top 2 * beam_width log-probabilities only
(vLLM may add the sampled token); with temperature > 0 log-probabilities are taken of logits /
temperature; there are no stop strings. When the pool runs dry, the newest request is preempted:
with preemption_mode "recompute" it restarts its search from the prompt later (the search is
deterministic, so only its cost changes); with "swap" (chapter 06) its beams' blocks go to the CPU
swap space, shared blocks once, and come back when there is room, the search carrying on where it
was. A request whose beams could not fit in an empty pool even when they share nothing but the
prompt is refused (``BeamSearchOutput.refused``).

Not handled: early stopping, per-request parameters, streaming.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from minipaged.kv.base import blocks_for

# torch is imported inside the functions that need it: the search loop, the selection and the
# policy-backed beams are plain Python, so the trace simulator (no torch) runs them too.


def _fail(name, value, allowed):
    raise ValueError(f"BeamSearchParams.{name}={value!r} is not allowed: {allowed}")


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # 0: log-probabilities of the raw logits
    length_penalty: float = 1.0  # score = cum_logprob / len(tokens) ** length_penalty

    def __post_init__(self):
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail(name, value, "an integer >= 1")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature >= 0:
            _fail("temperature", self.temperature, "a number >= 0")
        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)):
            _fail("length_penalty", self.length_penalty, "a number")


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt, then the generated tokens
    logprobs: list[float] = field(default_factory=list)  # of each generated token
    cum_logprob: float = 0.0
    text: str | None = None  # the generated tokens decoded (without a final EOS); set at the end
    finish_reason: str | None = None  # "stop" (ended in EOS) or "length"


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first, at most beam_width
    refused: str | None = None  # why the request was refused (then sequences is empty)


def beam_score(tokens: list[int], cum_logprob: float, eos_token_id: int | None, length_penalty: float) -> float:
    """vLLM's ranking: cum_logprob / length ** length_penalty, the length without a final EOS."""
    length = len(tokens) - (1 if eos_token_id is not None and tokens[-1] == eos_token_id else 0)
    return cum_logprob / (length ** length_penalty)


def candidate_logprobs(logits, width: int, temperature: float) -> list[list[tuple[int, float]]]:
    """logits [B, V] (torch) -> per beam its 2 * width most likely (token, logprob), best first."""
    import torch

    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    values, ids = torch.topk(logp, min(2 * width, logp.shape[-1]), dim=-1)  # [B, 2 * width]
    return [list(zip(row_ids.tolist(), row_values.tolist())) for row_ids, row_values in zip(ids, values)]


def select_beams(beams: list[BeamSearchSequence], candidates: list[list[tuple[int, float]]], width: int,
                 eos_token_id: int | None, ignore_eos: bool, length_penalty: float):
    """One step of the search for one request. Returns (new beams as [(parent index, beam)], best
    first, at most width; the candidates that ended in EOS, complete)."""
    def grow(parent: int, token: int, logprob: float, finish_reason=None) -> BeamSearchSequence:
        beam = beams[parent]
        return BeamSearchSequence(beam.tokens + [token], beam.logprobs + [logprob], beam.cum_logprob + logprob,
                                  finish_reason=finish_reason)

    live, complete = [], []
    for parent, (beam, options) in enumerate(zip(beams, candidates)):
        for token, logprob in options:
            if token == eos_token_id and not ignore_eos:
                complete.append(grow(parent, token, logprob, "stop"))
            else:  # (score, parent, token, logprob): a beam is built only for the winners
                length = len(beam.tokens) + (token != eos_token_id)  # beam_score's length, without the list
                live.append(((beam.cum_logprob + logprob) / length ** length_penalty, parent, token, logprob))
    live.sort(key=lambda c: c[0], reverse=True)  # stable: ties keep parent order, then token order
    return [(parent, grow(parent, token, logprob)) for _, parent, token, logprob in live[:width]], complete


def worst_case_blocks(prompt_len: int, max_tokens: int, width: int, block_size: int) -> int:
    """The most blocks one beam search can hold when its beams share nothing but the full prompt
    blocks (those are never written again, so no beam ever copies them)."""
    shared = prompt_len // block_size
    return shared + width * (blocks_for(prompt_len + max_tokens, block_size) - shared)


@dataclass
class _Request:
    index: int
    prompt: list[int]
    max_tokens: int
    beams: list[BeamSearchSequence] = field(default_factory=list)
    kv_ids: list[int] = field(default_factory=list)  # the memory backend's id of each live beam
    cached: list[int] = field(default_factory=list)  # tokens of each beam whose K/V is computed
    complete: list[BeamSearchSequence] = field(default_factory=list)
    steps: int = 0

    def restart(self) -> None:
        self.beams, self.kv_ids, self.cached, self.complete, self.steps = [], [], [], [], 0


class BeamSearch:
    """The search loop over many requests at once, on a memory backend (PagedBeams or PrivateBeams)."""

    def __init__(self, backend, params: BeamSearchParams, eos_token_id: int | None, max_num_seqs: int = 64,
                 preemption_mode: str = "recompute"):
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode={preemption_mode!r} is not known; choose one of ['recompute', 'swap']")
        self.backend, self.params, self.eos = backend, params, eos_token_id
        self.max_num_seqs = max_num_seqs
        self.preemption_mode = preemption_mode
        self._ids = itertools.count()
        self._swapped: deque = deque()  # requests whose beams wait in the swap space, oldest first

    def _swap_in(self, active: list) -> None:
        """Swapped-out requests come back first, oldest first, with room for one token per beam."""
        while self._swapped:
            r = self._swapped[0]
            beams = sum(len(a.beams) for a in active)
            if active and beams + len(r.beams) > self.max_num_seqs:
                return
            keep_free = len(r.kv_ids) + (getattr(self.backend.policy, "watermark_blocks", 0) if active else 0)
            if not self.backend.can_swap_in(r.kv_ids, keep_free):
                return
            self._swapped.popleft()
            self.backend.swap_in(r.kv_ids)
            active.append(r)

    def _admit(self, waiting: deque, active: list, outputs: dict) -> None:
        width = self.params.beam_width
        self._swap_in(active)
        while waiting and not self._swapped:
            r = waiting[0]
            if active and sum(len(a.beams) for a in active) + width > self.max_num_seqs:
                break
            try:
                if not self.backend.can_admit(len(r.prompt), r.max_tokens, width):
                    break  # first come, first served
            except ValueError as refusal:
                outputs[r.index] = BeamSearchOutput([], refused=str(refusal))
                waiting.popleft()
                continue
            waiting.popleft()
            r.beams, r.kv_ids, r.cached = [BeamSearchSequence(list(r.prompt))], [next(self._ids)], [0]
            self.backend.start(r.kv_ids[0], len(r.prompt), r.max_tokens)
            active.append(r)

    def _preempt(self, active: list, waiting: deque) -> _Request:
        victim = active.pop()  # the newest request: swapped out, or started over later
        self.backend.stats["preemptions"] += 1
        if self.preemption_mode == "swap" and self.backend.can_swap_out(victim.kv_ids):
            self.backend.swap_out(victim.kv_ids)  # its beams and their sharing, as they are
            self._swapped.appendleft(victim)  # the newest victim was admitted after the others
            return victim
        for kv_id in victim.kv_ids:
            self.backend.free(kv_id)
        victim.restart()
        waiting.appendleft(victim)
        return victim

    def _reserve(self, active: list, waiting: deque):
        """[(request, kv_id, new tokens, cached, slots)] for every live beam, in order.

        A request's beams are reserved together or not at all: if the pool cannot take all of them
        (growth and copies on write counted together), the newest request is preempted first. The
        newest has not been reserved yet (it sits at or after this one), so nothing is half done.
        """
        work, i = [], 0
        while i < len(active):
            r = active[i]
            news = [beam.tokens[cached:] for beam, cached in zip(r.beams, r.cached)]
            if not self.backend.can_reserve_all([(kv_id, len(new)) for kv_id, new in zip(r.kv_ids, news)]):
                if len(active) == 1:
                    raise RuntimeError("a lone beam search ran out of memory; the admission check is wrong")
                self._preempt(active, waiting)
                continue
            for b, new in enumerate(news):
                work.append((r, r.kv_ids[b], new, r.cached[b], self.backend.reserve(r.kv_ids[b], len(new))))
            i += 1
        return work

    def _advance(self, r: _Request, candidates) -> None:
        """Select r's next beams from its beams' candidates and move the K/V to match."""
        p = self.params
        chosen, complete = select_beams(r.beams, candidates, p.beam_width, self.eos, p.ignore_eos,
                                        p.length_penalty)
        r.complete += complete
        r.steps += 1
        if r.steps >= r.max_tokens or not chosen:  # done: the last tokens need no K/V
            for kv_id in r.kv_ids:
                self.backend.free(kv_id)
            r.beams, r.kv_ids, r.cached = [beam for _, beam in chosen], [], []
            return
        kv_ids, cached, taken = [], [], set()
        for parent, _ in chosen:
            if parent not in taken:  # the first child takes the parent's blocks over
                taken.add(parent)
                kv_ids.append(r.kv_ids[parent])
            else:  # the others share them
                kv_ids.append(next(self._ids))
                self.backend.fork(r.kv_ids[parent], kv_ids[-1])
            cached.append(r.cached[parent])
        for parent, kv_id in enumerate(r.kv_ids):
            if parent not in taken:  # pruned: nobody continues this beam
                self.backend.free(kv_id)
        r.beams, r.kv_ids, r.cached = [beam for _, beam in chosen], kv_ids, cached

    def _finish(self, r: _Request, tokenizer) -> BeamSearchOutput:
        p = self.params
        for beam in r.beams:
            beam.finish_reason = "length"
        ranked = sorted(r.complete + r.beams, reverse=True,
                        key=lambda s: beam_score(s.tokens, s.cum_logprob, self.eos, p.length_penalty))
        best = ranked[:p.beam_width]
        for beam in best:
            out = beam.tokens[len(r.prompt):]
            if beam.finish_reason == "stop":
                out = out[:-1]
            beam.text = tokenizer.decode(out) if tokenizer is not None else None
        return BeamSearchOutput(best)

    def run(self, prompts: list[list[int]], max_model_len: int, tokenizer, on_finish=None,
            max_tokens: list[int] | None = None) -> list[BeamSearchOutput]:
        """Search every prompt; max_tokens (one per prompt) overrides params.max_tokens (the simulator
        gives each request its own length). tokenizer None leaves .text unset."""
        limits = max_tokens if max_tokens is not None else [self.params.max_tokens] * len(prompts)
        requests = [_Request(i, ids, min(limit, max_model_len - len(ids)))
                    for i, (ids, limit) in enumerate(zip(prompts, limits))]
        waiting, active, outputs = deque(requests), [], {}
        while waiting or active or self._swapped:
            self._admit(waiting, active, outputs)
            if not active:
                if waiting:
                    raise RuntimeError(f"request {waiting[0].index} can neither be admitted nor refused")
                break
            work = self._reserve(active, waiting)
            candidates = self.backend.forward([w[1:] for w in work], self.params.beam_width,
                                              self.params.temperature)  # per beam, in work's order
            per_request: dict[int, list] = {}  # id(request) -> its beams' candidates, in beam order
            for w, options in zip(work, candidates):
                per_request.setdefault(id(w[0]), []).append(options)
            for r in list(active):
                r.cached = [len(beam.tokens) for beam in r.beams]
                self._advance(r, per_request[id(r)])
                if not r.kv_ids:
                    active.remove(r)
                    outputs[r.index] = self._finish(r, tokenizer)
                    if on_finish:
                        on_finish(r.index)
        return [outputs[i] for i in range(len(requests))]


class PolicyBeams:
    """Beams whose blocks a sharing KV policy keeps: a fork shares blocks, a write copies on write.
    The memory side of PagedBeams; the trace simulator drives it with synthetic log-probabilities."""

    def __init__(self, policy, stats: dict | None = None):
        if not policy.shares_blocks:
            raise ValueError(f"beam search on a KV pool needs kv_policy='shared', not {policy.label!r}")
        self.policy = policy
        self.stats = stats if stats is not None else {}
        for key in ("steps", "preemptions", "forks"):
            self.stats.setdefault(key, 0)

    def can_admit(self, prompt_len: int, max_tokens: int, width: int) -> bool:
        worst = worst_case_blocks(prompt_len, max_tokens, width, self.policy.block_size)
        if worst > self.policy.num_blocks:
            raise ValueError(f"beam search with beam_width={width} over a {prompt_len}-token prompt and "
                             f"max_tokens={max_tokens} may need {worst} blocks; the whole pool has "
                             f"{self.policy.num_blocks}")
        return self.policy.can_allocate(prompt_len, max_tokens)

    def start(self, kv_id: int, prompt_len: int, max_tokens: int) -> None:
        self.policy.allocate(kv_id, prompt_len, max_tokens)

    def reserve(self, kv_id: int, n: int) -> list[int]:
        return self.policy.append_slots(kv_id, n)

    def can_reserve_all(self, reservations: list[tuple[int, int]]) -> bool:
        return self.policy.can_append_all(reservations)

    def can_swap_out(self, kv_ids) -> bool:
        return False  # no K/V to move: only the engine-backed beams swap

    def fork(self, parent: int, child: int) -> None:
        self.policy.fork(parent, child)
        self.stats["forks"] += 1

    def free(self, kv_id: int) -> None:
        self.policy.free(kv_id)


class PagedBeams(PolicyBeams):
    """Beams in the paged engine's pool (kv_policy "shared"): the engine's forward pass, the
    engine's block copies."""

    def __init__(self, engine):
        super().__init__(engine.policy, engine.stats)
        self.engine = engine

    def forward(self, work, width: int, temperature: float):
        self.stats["steps"] += 1
        return candidate_logprobs(self.engine.forward(work), width, temperature)

    # Swapping (chapter 06): the copies are made at once. Nothing of this step is written yet, the
    # victim was not reserved in it, and no other request shares its blocks.
    def can_swap_out(self, kv_ids) -> bool:
        space = self.engine.swap_space
        return space is not None and space.can_swap_out(self.policy, kv_ids)

    def swap_out(self, kv_ids) -> None:
        self.engine.swap_blocks(self.engine.swap_space.swap_out(self.policy, kv_ids), [])
        self.stats["preempted_swap"] = self.stats.get("preempted_swap", 0) + 1

    def can_swap_in(self, kv_ids, keep_free: int) -> bool:
        return self.engine.swap_space.can_swap_in(self.policy, kv_ids, keep_free)

    def swap_in(self, kv_ids) -> None:
        self.engine.swap_blocks([], self.engine.swap_space.swap_in(self.policy, kv_ids))


class PrivateBeams:
    """The oracle: each beam owns its K/V tensors (a PerRequestKVCache); a fork clones them in full."""

    def __init__(self, model):
        self.model = model
        self.caches: dict = {}
        self.stats = {"steps": 0, "forward_passes": 0, "preemptions": 0, "forks": 0, "max_beams": 0}

    def can_admit(self, prompt_len: int, max_tokens: int, width: int) -> bool:
        return True  # memory is not bounded here

    def start(self, kv_id: int, prompt_len: int, max_tokens: int) -> None:
        from minipaged.kv.per_request import PerRequestKVCache

        self.caches[kv_id] = PerRequestKVCache(self.model.config.num_layers)

    def reserve(self, kv_id: int, n: int) -> None:
        return None

    def can_reserve_all(self, reservations) -> bool:
        return True

    def can_swap_out(self, kv_ids) -> bool:
        return False

    def fork(self, parent: int, child: int) -> None:
        from minipaged.kv.per_request import PerRequestKVCache

        source, copy = self.caches[parent], PerRequestKVCache(self.model.config.num_layers)
        copy.k = [t.clone() for t in source.k]  # a private copy of every layer: nothing is shared
        copy.v = [t.clone() for t in source.v]
        self.caches[child] = copy
        self.stats["forks"] += 1

    def free(self, kv_id: int) -> None:
        del self.caches[kv_id]

    def forward(self, work, width: int, temperature: float):
        import torch

        from minipaged.kv.per_request import BatchOfCaches

        device = self.model.device
        tokens = [t for _, new, _, _ in work for t in new]
        positions = [p for _, new, cached, _ in work for p in range(cached, cached + len(new))]
        lens = [len(new) for _, new, _, _ in work]
        batch = BatchOfCaches([self.caches[kv_id] for kv_id, *_ in work], lens)
        last_rows = torch.tensor(lens).cumsum(0) - 1
        self.stats["steps"] += 1
        self.stats["forward_passes"] += 1
        self.stats["max_beams"] = max(self.stats["max_beams"], len(work))
        logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device), batch,
                            logits_rows=last_rows.to(device))  # [B, V], the same rows as the paged batch
        return candidate_logprobs(logits, width, temperature)
