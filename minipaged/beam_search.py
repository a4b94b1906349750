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

The search is a request of the engine like any other: the scheduler plans every live beam as a
sequence of the request (request.py), the runner computes their logits in the step's forward
pass and gives each beam its 2 * beam_width best candidates instead of a sampled token
(``candidate_logprobs``), and where the scheduler applies the step's output (scheduler/continuous.py)
it hands them to the search: the search ranks the candidates (``select_beams``) and says
how the K/V follows (``plan_moves``: take over, fork, prune), which the scheduler carries out
through the KV policy. The engine core's step has no branch for it. So beam search gets admission,
preemption, the prefix cache and chunked prefill from the engine, and has no loop of its own.
Which memory it uses is the KV policy's choice:
    "shared" / "prefix_caching"   beams share blocks in the paged pool (the thing being taught);
    "per_request"                 every beam owns private K/V tensors, copied whole when a beam
                                  branches: a plain beam search without any sharing, the oracle.
                                  Run one search at a time on both, they compute the same
                                  floating-point numbers.

Differences from vLLM, on purpose: candidates are the top 2 * beam_width log-probabilities only
(vLLM may add the sampled token); with temperature > 0 log-probabilities are taken of logits /
temperature; there are no stop strings; vLLM's own beam search sends one-token requests and
relies on the prefix cache to share the beams' K/V. When the pool runs dry, the newest request is
preempted: with preemption_mode "recompute" it restarts its search from the prompt later (the search is
deterministic, so only its cost changes); with "swap" (chapter 06) its beams' blocks go to the CPU
swap space, shared blocks once, and come back when there is room, the search carrying on where it
was. A request whose beams could not fit in an empty pool even when they share nothing but the
prompt is refused (``BeamSearchOutput.refused``).

Not handled: early stopping, streaming, speculation (the scheduler drafts only for lone sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.kv.base import blocks_for
from minipaged.outputs import CompletionOutput, RequestOutput
from minipaged.request import Sequence
from minipaged.sampling_params import SAMPLING_EPS, BeamSearchParams, SamplingParams  # noqa: F401  (BeamSearchParams: vLLM keeps it in sampling_params)

# torch is imported inside the one function that needs it (candidate_logprobs): the selection and the
# moves are plain Python, so the sharing simulator (no torch) runs them too.


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

    scaled = logits.float() / temperature if temperature >= SAMPLING_EPS else logits.float()
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
class BeamState:
    """One beam search inside the engine: its live beams (``beams[i]`` is ``seqs[i]``'s search
    state), the finished candidates, and the logits rows its beams got this step."""

    params: BeamSearchParams
    prompt: list[int]
    max_tokens: int
    beams: list[BeamSearchSequence]
    seqs: list  # the Sequence of each live beam, in beam order (the request runs them)
    eos_token_id: int | None = None
    complete: list[BeamSearchSequence] = field(default_factory=list)
    steps: int = 0
    rows: dict = field(default_factory=dict)  # seq_id -> logits row, until every live beam has one
    output: BeamSearchOutput | None = None  # set when the search is over (or refused)

    def ready(self) -> bool:
        """Whether every live beam has its logits row for this step."""
        return bool(self.seqs) and all(s.seq_id in self.rows for s in self.seqs)

    def restart(self, seq_id: int):
        """Start over from the prompt, as one new sequence (a preemption by recompute: the beams,
        prefilled again one by one, could need more memory than the search that shared them; the
        search is deterministic, so only its cost changes). Returns that sequence."""
        old = self.seqs[0]
        seq = Sequence(seq_id, list(old.prompt_ids), old.params, old.eos_token_id, old.max_model_len,
                       arrival_time=old.arrival_time)
        self.beams, self.seqs, self.complete, self.steps = [BeamSearchSequence(list(self.prompt))], [seq], [], 0
        self.rows.clear()
        return seq

    def advance(self, new_seq_id) -> BeamMoves:
        """One step of the search, once every live beam has its candidates (``ready``): rank them
        (``select_beams``) and say how the K/V follows, for the scheduler to carry out through the KV
        policy. The first new beam of a parent is the parent's sequence itself (it keeps the blocks),
        every further one is a new sequence forked from it, and a parent nobody continues is freed.
        After max_tokens steps, or when no live beam is left, the search is over: every sequence is
        freed (the last tokens need no K/V) and ``output`` holds the answer."""
        p = self.params
        candidates = [self.rows.pop(s.seq_id) for s in self.seqs]
        chosen, complete = select_beams(self.beams, candidates, p.beam_width, self.eos_token_id, p.ignore_eos,
                                        p.length_penalty)
        self.complete += complete
        self.steps += 1
        moves = BeamMoves(num_tokens=len(chosen) + len(complete))
        if self.steps >= self.max_tokens or not chosen:
            for seq in self.seqs:
                seq.finish_reason = seq.finish_reason or "length"
            moves.freed, self.seqs, self.beams = self.seqs, [], [beam for _, beam in chosen]
            self.output = finish_output(self, self.eos_token_id)
            return moves
        forks, pruned = plan_moves(chosen, len(self.seqs))
        seqs = []
        for (parent, _), fork in zip(chosen, forks):  # every fork copies its parent before any appends
            seq = self.seqs[parent]
            if fork:  # a new sequence with the parent's tokens so far, and (once forked) its blocks
                child = Sequence(new_seq_id(), seq.prompt_ids, seq.params, seq.eos_token_id, seq.max_model_len,
                                 output_ids=list(seq.output_ids), arrival_time=seq.arrival_time,
                                 num_cached_tokens=seq.num_cached_tokens)
                moves.forks.append((seq, child))
                seq = child
            seqs.append(seq)
        moves.freed = [self.seqs[parent] for parent in pruned]
        for (_, beam), seq in zip(chosen, seqs):
            seq.append(beam.tokens[-1], None, beam.logprobs[-1])
        self.beams, self.seqs = [beam for _, beam in chosen], seqs
        return moves

    def never_fits(self, policy) -> str | None:
        """Why this search could never run even in an empty pool, or None. A beam search cannot be
        split the way samples can (a preemption makes one request per sample), so its worst case,
        beams that share nothing but the prompt, must fit whole."""
        if not policy.bounded:
            return None
        seq, width = self.seqs[0], self.params.beam_width
        worst = worst_case_blocks(len(seq.prompt_ids), seq.max_new_tokens, width, policy.block_size)
        if worst <= policy.num_blocks:
            return None
        return (f"beam search with beam_width={width} over a {len(seq.prompt_ids)}-token prompt and "
                f"max_tokens={seq.max_new_tokens} may need {worst} blocks; the whole pool has {policy.num_blocks}")


@dataclass
class BeamMoves:
    """What one step of a search asks of the KV policy, in this order: fork each (parent, child),
    then free each of ``freed``."""

    num_tokens: int  # tokens the step generated: every beam kept, live or complete
    forks: list = field(default_factory=list)
    freed: list = field(default_factory=list)


def beam_request(request, params: BeamSearchParams, policy, seq_id: int, max_model_len: int,
                 eos_token_id: int | None, max_tokens: int | None = None):
    """Make ``request`` (the core's, with its prompt) a beam search: one sequence, the prompt, from
    which the beams branch; ``max_tokens`` overrides params.max_tokens (the simulator gives each
    request its own). Its own Sequence only carries the beam's tokens: the search decides when it ends."""
    if not policy.can_fork:
        raise ValueError(f"beam search needs kv_policy='shared' or 'prefix_caching' (beams share blocks) or "
                         f"'per_request' (private copies); {policy.label!r} cannot fork a sequence")
    prompt = request.prompt_ids
    limit = min(params.max_tokens if max_tokens is None else max_tokens, max_model_len - len(prompt))
    request.params = SamplingParams(temperature=0, max_tokens=max(limit, 1), ignore_eos=True)
    seq = Sequence(seq_id, list(prompt), request.params, eos_token_id=None, max_model_len=max_model_len,
                   arrival_time=request.arrival_time)
    request.seqs = [seq]
    request.beam = BeamState(params, list(prompt), limit, [BeamSearchSequence(list(prompt))], [seq],
                             eos_token_id=eos_token_id)
    return request


def check_beam_params(params, max_num_seqs: int) -> None:
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}")
    params.validate()
    if params.beam_width > max_num_seqs:
        raise ValueError(f"BeamSearchParams.beam_width={params.beam_width} is not allowed: an integer in "
                         f"[1, {max_num_seqs}] (max_num_seqs: the beams run side by side)")


def request_output(request, finished: bool, tokenizer, outputs: dict):
    """The RequestOutput of a beam search: once finished, one CompletionOutput per best beam (its
    BeamSearchOutput goes into ``outputs`` under the request's id, for ``LLMEngine.beam_output``)."""
    completions = []
    if finished and request.beam.output is not None:
        outputs[request.request_id] = out = request.beam.output
        n = len(request.prompt_ids)
        decode_texts(out, n, tokenizer)
        completions = [CompletionOutput(i, b.text or "", b.tokens[n:], b.cum_logprob, None, b.finish_reason)
                       for i, b in enumerate(out.sequences)]
    return RequestOutput(request.request_id, request.extra.get("prompt"), request.prompt_ids, completions,
                         finished=finished, metrics={"arrival_time": request.arrival_time,
                                                     "finished_time": request.finished_time})


def plan_moves(chosen: list[tuple[int, BeamSearchSequence]], num_parents: int) -> tuple[list[bool], list[int]]:
    """How the K/V follows the new beams. chosen: [(parent index, new beam)], best first. Returns
    (for each new beam, whether it is a fork of its parent rather than the parent itself; the
    parents nobody continues, to be freed). The first new beam of a parent takes the parent's blocks
    over, every further one forks them."""
    taken, forks = set(), []
    for parent, _ in chosen:
        forks.append(parent in taken)
        taken.add(parent)
    return forks, [p for p in range(num_parents) if p not in taken]


def finish_output(state: BeamState, eos_token_id: int | None) -> BeamSearchOutput:
    """The best beam_width of (complete + live) beams by score (``decode_texts`` adds their texts)."""
    p = state.params
    for beam in state.beams:
        beam.finish_reason = "length"
    ranked = sorted(state.complete + state.beams, reverse=True,
                    key=lambda s: beam_score(s.tokens, s.cum_logprob, eos_token_id, p.length_penalty))
    return BeamSearchOutput(ranked[:p.beam_width])


def decode_texts(output: BeamSearchOutput, prompt_len: int, tokenizer) -> None:
    """Each beam's generated tokens as text, without a final EOS (the front end does this)."""
    for beam in output.sequences:
        if beam.text is None:
            out = beam.tokens[prompt_len:]
            beam.text = tokenizer.decode(out[:-1] if beam.finish_reason == "stop" else out)
