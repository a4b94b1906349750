"""The offline front end: ``LLM`` with vLLM's names (``generate``, ``chat``, ``beam_search``).

    llm = LLM(model="smollm2-135m")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))
    outs[0].outputs[0].text

``LLM(**options)`` builds one ``EngineArgs`` (config.py) and an ``LLMEngine`` (llm_engine.py) over
it; ``generate`` checks every prompt and parameter before any work starts (a bad one raises a
ValueError naming the field), adds them all as requests and steps the engine until they are done,
with a progress bar. The defaults are the finished engine: paged, shared blocks with the prefix
cache, continuous batching, the batched CPU attention. A chapter that shows an earlier stage names
it, e.g. ``LLM(model, kv_policy="per_request")`` for chapter 00's one-sequence-at-a-time engine.

    llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=32))   as vLLM's (beam_search.py)

Not handled yet: LoRA, multi-modal prompts, priorities.
"""

from __future__ import annotations

import itertools
import numbers

from minipaged.config import KV_POLICIES, EngineArgs
from minipaged.llm_engine import LLMEngine, prompt_token_ids
from minipaged.outputs import RequestOutput
from minipaged.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["LLM", "KV_POLICIES"]


class LLM:
    """An offline engine over one model. Every keyword option is a field of ``EngineArgs``
    (config.py, where each is explained); an unknown one is a ValueError listing the known ones."""

    def __init__(self, model: str = "smollm2-135m", **options):
        unknown = sorted(set(options) - set(EngineArgs.field_names()))
        if unknown:
            raise ValueError(f"LLM() got unknown options {unknown}; the known ones are {EngineArgs.field_names()}")
        self.engine = self.llm_engine = LLMEngine(EngineArgs(model=model, **options))  # validates them
        self.args = self.engine.args
        self.model, self.tokenizer, self.config = self.engine.model, self.engine.tokenizer, self.engine.config
        self.max_model_len = self.engine.max_model_len
        self.kv_policy = self.args.kv_policy
        self.max_num_seqs = self.args.max_num_seqs
        self._request_ids = itertools.count()

    def get_metrics(self) -> list:
        """Every engine metric's current value (objects with ``name`` and ``value``), as vLLM V1's."""
        return self.engine.get_metrics()

    # ---------------------------------------------------------------- input checking
    @staticmethod
    def _prompt_list(prompts) -> list:
        """One prompt or a list of them, as a list (a list of ints is one prompt of token ids)."""
        if isinstance(prompts, (str, dict, bytes, bytearray)) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], numbers.Integral)
        ):
            return [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of token ids, or a list of such prompts; "
                             f"got {type(prompts).__name__}")
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt")
        return list(prompts)

    def _normalize(self, prompts, sampling_params):
        prompts = self._prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        elif isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts; "
                                 "give one SamplingParams or one per prompt")
        else:
            hint = "; build one with SamplingParams(**fields)" if isinstance(sampling_params, dict) else ""
            raise ValueError(f"sampling_params must be a SamplingParams or a list of them (one per prompt), "
                             f"got {type(sampling_params).__name__}{hint}")
        checked = [self.engine.check_request(prompt, p, where=f"prompts[{i}]")
                   for i, (prompt, p) in enumerate(zip(prompts, params))]
        return [(text, ids) for text, ids, _ in checked], [p for _, _, p in checked]

    # ---------------------------------------------------------------- public API
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete each prompt. ``prompts``: a string, a list of strings, or token-id lists (or
        vLLM's {"prompt": ...} / {"prompt_token_ids": ...} dicts). One RequestOutput per prompt, in order."""
        from dataclasses import replace

        requests, params = self._normalize(prompts, sampling_params)
        ids = [f"offline-{next(self._request_ids)}" for _ in requests]
        for request_id, (_, prompt_ids), p in zip(ids, requests, params):
            if p.output_kind is not RequestOutputKind.FINAL_ONLY:  # the offline call returns finished outputs only
                p = replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
            self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, p)
        done = self._run(len(ids), "generating", use_tqdm)
        outputs = []
        for request_id, (text, _) in zip(ids, requests):
            out = done[request_id]
            out.prompt = text
            outputs.append(out)
        return outputs

    def _run(self, total: int, desc: str, use_tqdm: bool) -> dict[str, RequestOutput]:
        """Step the engine until every request is done, with a progress bar; {request_id: its final
        output}. An interrupt or an error gives every block back before it propagates."""
        from tqdm import tqdm

        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=total, desc=desc, unit="prompt", disable=not use_tqdm)
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        except BaseException:
            self.engine.abort_all()
            raise
        finally:
            bar.close()
        return done

    def beam_search(self, prompts, params, use_tqdm: bool = False):
        """vLLM's ``LLM.beam_search``: for each prompt, the best params.beam_width sequences found by
        beam search (a list of BeamSearchOutput, one per prompt; see minipaged/beam_search.py).

        The searches run in the engine core like any request: the scheduler plans their beams, the
        KV policy forks and frees them. kv_policy "shared" (or "prefix_caching") keeps the beams in
        the paged pool, sharing blocks; "per_request" gives every beam private K/V, copied whole when
        beams branch (the unshared oracle). Other policies cannot fork a sequence: a ValueError.
        """
        prompts = [prompt_token_ids(p, self.tokenizer, self.config.vocab_size, self.max_model_len, f"prompts[{i}]")[1]
                   for i, p in enumerate(self._prompt_list(prompts))]  # all checked before any is queued
        request_ids = [f"beam-{next(self._request_ids)}" for _ in prompts]
        for request_id, prompt in zip(request_ids, prompts):
            self.engine.add_beam_request(request_id, {"prompt_token_ids": prompt}, params)
        self._run(len(prompts), "beam search", use_tqdm)
        return [self.engine.beam_output(request_id) for request_id in request_ids]

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True):
        """Apply the model's chat template to one conversation (or a list of them), then generate."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts "
                             f"(or a list of such conversations); got {messages!r:.60}")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        for i, conversation in enumerate(conversations):
            where = "messages" if len(conversations) == 1 and conversation is messages else f"messages[{i}]"
            if not isinstance(conversation, (list, tuple)) or not conversation:
                raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} dicts")
            for j, m in enumerate(conversation):
                if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                    raise ValueError(f"{where}[{j}]={m!r:.80} must be a dict whose 'role' and 'content' are strings")
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block, as vLLM's ``LLM.reset_prefix_cache`` does: the next requests
        start cold. False (nothing to reset) unless the prefix cache is on."""
        policy = self.engine.policy
        if not policy.caches_prefixes:
            return False
        policy.reset_cache()
        return True

    def get_tokenizer(self):
        return self.tokenizer
