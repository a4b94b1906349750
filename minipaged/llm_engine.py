"""``LLMEngine``: the online engine, with vLLM's names. Requests come and go while others decode.

    from minipaged import LLMEngine, EngineArgs, SamplingParams
    engine = LLMEngine.from_engine_args(EngineArgs(model="tiny"))
    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():          # RequestOutput: .request_id, .outputs, .finished
            ...
    engine.abort_request(["r1"])           # its blocks are back in the pool before the next step

The engine wraps the core (core.py) with what a client needs around it:

    input processing   a prompt (a string, {"prompt": ...}, {"prompt_token_ids": [...]}) becomes
                       token ids; prompt and SamplingParams are checked before anything is queued,
                       so a bad request is a ValueError that names the field and touches no memory;
    output processing  after each step, a RequestOutput for every request that changed. Its
                       SamplingParams.output_kind says what it carries: everything so far
                       (CUMULATIVE, the default), only what is new (DELTA, for streaming), or
                       nothing until the end (FINAL_ONLY). A streamed text never shows characters
                       that a stop string later takes back, nor half of a multi-byte character, so
                       the joined deltas equal the final text.

Detokenizing and stop strings happen inside the core here (``Sequence.append``), so that a stop
string frees the sequence's blocks in the same step; vLLM's front end checks them in its output
processor and aborts the request in the core.

``LLM`` (llm.py) is a loop over this engine with a progress bar; the server (chapter 11) steps it
from a background thread.

Not handled yet: LoRA, multi-modal prompts, priorities, tracing.
"""

from __future__ import annotations

from minipaged.beam_search import check_beam_params
from minipaged.beam_search import request_output as beam_request_output
from minipaged.build import build_core
from minipaged.config import EngineArgs
from minipaged.outputs import CompletionOutput, RequestOutput
from minipaged.request import RequestStatus
from minipaged.sampling_params import RequestOutputKind, SamplingParams


def _kind(value) -> str:
    return type(value).__name__


def prompt_token_ids(prompt, tokenizer, vocab_size: int, max_model_len: int, where: str = "prompt"):
    """(text or None, token ids) of a prompt, checked. ``where`` names it in errors (e.g. "prompts[3]").

    A prompt is a string, a list of token ids (Python or numpy integers), or vLLM's {"prompt": str}
    / {"prompt_token_ids": [ids]}."""
    import numbers

    if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt
        if "prompt_token_ids" in prompt:
            where, prompt = f"{where}['prompt_token_ids']", prompt["prompt_token_ids"]
            if not isinstance(prompt, (list, tuple)):
                raise ValueError(f"{where} must be a list of token ids, got {_kind(prompt)}")
        elif "prompt" in prompt:
            where, prompt = f"{where}['prompt']", prompt["prompt"]
            if not isinstance(prompt, str):
                raise ValueError(f"{where} must be a string, got {_kind(prompt)}")
        else:
            raise ValueError(f"{where} is a dict without 'prompt' or 'prompt_token_ids' "
                             f"(its keys: {sorted(map(str, prompt))})")
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where} is not valid text: character {e.start} ({prompt[e.start]!r}) is a lone "
                             "surrogate, which UTF-8 cannot encode") from None
        text, ids = prompt, tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)):
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ValueError(f"{where}[{i}]={t!r} is a {_kind(t)}; a token id is an integer in [0, {vocab_size})")
        text, ids = None, [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{where} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    elif isinstance(prompt, (bytes, bytearray)):
        raise ValueError(f"{where} is {_kind(prompt)}; decode it to a string first (e.g. prompt.decode('utf-8'))")
    else:
        raise ValueError(f"{where} must be a string, a list of token ids, or a {{'prompt': ...}} / "
                         f"{{'prompt_token_ids': ...}} dict; got {_kind(prompt)}")
    if not ids:
        raise ValueError(f"{where} is empty: give at least one token")
    if len(ids) >= max_model_len:
        raise ValueError(f"{where} has {len(ids)} tokens; with max_model_len={max_model_len} a prompt may have "
                         f"at most {max_model_len - 1} (room for one new token)")
    return text, ids


class LLMEngine:
    def __init__(self, args: EngineArgs, loaded=None):
        if not isinstance(args, EngineArgs):
            raise ValueError(f"engine_args must be EngineArgs, got {type(args).__name__}")
        self.args = args.validate()  # the one place options are checked
        self.core, loaded = build_core(self.args, loaded)
        core = self.core  # what it is made of, by name (for the chapters, the tests and the benchmarks):
        self.policy, self.scheduler, self.runner = core.policy, core.scheduler, core.runner
        self.swap_space, self.metrics, self.stats = core.swap_space, core.metrics, core.stats
        self.max_model_len = core.max_model_len
        self.model, self.tokenizer, self.config = loaded.model, loaded.tokenizer, loaded.config
        self._loaded = loaded
        self._sent: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens, characters) already streamed
        self._beam_outputs: dict = {}  # request_id -> BeamSearchOutput, until beam_output() takes it

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args)

    def get_tokenizer(self):
        return self.tokenizer

    def check_invariants(self, idle: bool = False) -> None:
        """The block managers' books agree; with idle=True, nothing is held (core.py)."""
        self.core.check_invariants(idle)

    def get_metrics(self) -> list:
        """Every metric's current value (objects with ``name`` and ``value``), as vLLM V1's."""
        return self.core.metrics.snapshot()

    # ---- requests ------------------------------------------------------------------------------

    def check_request(self, prompt, params, where: str = "prompt"):
        """(text, token ids, params) of a request, checked; nothing is queued."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            hint = "; build one with SamplingParams(**fields)" if isinstance(params, dict) else ""
            raise ValueError(f"sampling_params must be a SamplingParams, got {_kind(params)}{hint}")
        params.validate_for(self.config.vocab_size, self.args.max_num_seqs, self.args.max_logprobs)
        text, ids = prompt_token_ids(prompt, self.tokenizer, self.config.vocab_size, self.max_model_len, where)
        return text, ids, params

    def add_request(self, request_id, prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        """Queue a request. ``prompt``: a string, {"prompt": str} or {"prompt_token_ids": [ids]}."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id={request_id!r} must be a non-empty string")
        text, ids, params = self.check_request(prompt, params)
        request = self.core.add_request(request_id, ids, params, arrival_time)
        request.extra["prompt"] = text

    def add_beam_request(self, request_id, prompt, params) -> None:
        """Queue a beam search (``LLM.beam_search`` adds one per prompt). Its RequestOutput, once
        finished, has one CompletionOutput per best beam; ``beam_output(request_id)`` gives vLLM's
        BeamSearchOutput."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id={request_id!r} must be a non-empty string")
        check_beam_params(params, self.args.max_num_seqs)
        text, ids = prompt_token_ids(prompt, self.tokenizer, self.config.vocab_size, self.max_model_len)
        self.core.add_beam_request(request_id, ids, params).extra["prompt"] = text

    def beam_output(self, request_id: str):
        """The BeamSearchOutput of a finished beam search (once; it is forgotten after)."""
        return self._beam_outputs.pop(request_id)

    def abort_request(self, request_ids) -> None:
        """Stop these requests (a string or a list of ids); unknown or finished ids are ignored."""
        for request_id in self.core.abort_request(request_ids):
            self._forget(self.core.pop_finished(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.core.get_num_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One engine step; the outputs of the requests that changed in it."""
        outputs = []
        for request_id in self.core.step():
            request = self.core.requests[request_id]
            finished = request.finished
            kind = request.params.output_kind
            if finished:
                self.core.pop_finished(request_id)
            if kind is RequestOutputKind.FINAL_ONLY and not finished:
                continue
            outputs.append(self._output(request, finished, delta=kind is RequestOutputKind.DELTA))
            if finished:
                self._forget(request)
        return outputs

    def abort_all(self) -> None:
        """Drop every request and give every block back (an interrupted offline run does this)."""
        for request_id in list(self.core.requests):
            self._forget(self.core.requests[request_id])
        self.core.abort_all()
        self.core.requests.clear()

    # ---- output processing -----------------------------------------------------------------------

    def _output(self, request, finished: bool, delta: bool) -> RequestOutput:
        if request.beam is not None:  # a beam search (beam_search.py)
            return beam_request_output(request, finished, self.tokenizer, self._beam_outputs)
        completions = [self._completion(seq, delta, request) for seq in request.samples]
        if delta:  # a sample with nothing new stays out of a delta, unless the request is over
            completions = [c for c in completions if c.token_ids or c.text or c.finish_reason or finished]
        first = [s.first_token_time for s in request.samples if s.first_token_time is not None]
        metrics = {"arrival_time": request.arrival_time, "first_token_time": min(first) if first else None,
                   "finished_time": request.finished_time if finished else None,
                   "token_times": [list(s.token_times) for s in request.samples]}
        return RequestOutput(request.request_id, request.extra.get("prompt"), request.prompt_ids, completions,
                             finished=finished, metrics=metrics, num_cached_tokens=request.samples[0].num_cached_tokens)

    def _completion(self, seq, delta: bool, request) -> CompletionOutput:
        out = seq.to_output()
        if request.status is RequestStatus.REFUSED and not seq.output_ids:  # vLLM's way to say it: an abort
            out.stop_reason = f"refused: {request.refusal_reason}"
        if not delta:
            return out
        tokens_sent, chars_sent = self._sent.get(seq.seq_id, (0, 0))
        shown = seq.stream_text()
        self._sent[seq.seq_id] = (len(seq.output_ids), len(shown))
        out.text = shown[chars_sent:]
        out.token_ids = out.token_ids[tokens_sent:]
        if out.logprobs is not None:
            out.logprobs = out.logprobs[tokens_sent:]
        return out

    def _forget(self, request) -> None:
        for seq in request.samples:
            self._sent.pop(seq.seq_id, None)
