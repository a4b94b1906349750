"""The front end: `LLM` with vLLM's names (`generate`, `chat`), so scripts move to vLLM unchanged.

    llm = LLM(model="smollm2-135m")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))
    outs[0].outputs[0].text

The front end checks every prompt and parameter before any work starts (a bad one raises a
ValueError naming the field), turns each prompt into n Sequences and hands them to the engine that
the configuration chose.

Not handled yet: streaming, async serving, LoRA, multi-modal prompts.
"""

from __future__ import annotations

import itertools

from minipaged.engine import NaiveEngine
from minipaged.model import load_model
from minipaged.outputs import RequestOutput
from minipaged.sampling import make_generator, sample_seed
from minipaged.sampling_params import SamplingParams
from minipaged.sequence import Sequence

KV_POLICIES = ("per_request",)


class LLM:
    """An offline engine over one model.

    Args:
        model: "smollm2-135m" (the real chat model), "smollm2-135m-random", "tiny", or a .gguf path.
        dtype: "float32" (default; matches the reference implementation token for token), "bfloat16".
        seed: seeds the random weights of "tiny" and "smollm2-135m-random".
        kv_policy: where K and V live. "per_request" (chapter 00): a growing tensor per sequence.
        use_cache: False recomputes every token's K and V at every step (the oracle for caching).
        max_model_len: longest prompt + output allowed (default: the model's context length).
        device: torch device for the model.
    """

    def __init__(self, model: str = "smollm2-135m", *, dtype="float32", seed: int = 0,
                 kv_policy: str = "per_request", use_cache: bool = True, max_model_len: int | None = None,
                 device: str = "cpu", progress: bool = True):
        if kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy={kv_policy!r} is not known; choose one of {list(KV_POLICIES)}")
        loaded = load_model(model, dtype=dtype, seed=seed, progress=progress, device=device)
        self.model, self.tokenizer, self.config = loaded.model, loaded.tokenizer, loaded.config
        if max_model_len is not None and not 1 < max_model_len <= self.config.max_model_len:
            raise ValueError(f"max_model_len={max_model_len} must be in [2, {self.config.max_model_len}]")
        self.max_model_len = max_model_len or self.config.max_model_len
        self.kv_policy = kv_policy
        self.engine = NaiveEngine(self.model, self.tokenizer, use_cache=use_cache)
        self._request_ids = itertools.count()

    # ---------------------------------------------------------------- input checking
    def _prompt_ids(self, prompt, i: int) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"prompts[{i}] is a dict without 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            text, ids = None, list(prompt)
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"prompts[{i}] has token ids outside the vocabulary [0, "
                                 f"{self.config.vocab_size}): {bad[:5]}")
        else:
            raise ValueError(f"prompts[{i}] must be a string or a list of token ids, "
                             f"got {type(prompt).__name__}")
        if not ids:
            raise ValueError(f"prompts[{i}] is empty: give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompts[{i}] has {len(ids)} tokens; with max_model_len={self.max_model_len} "
                             f"a prompt may have at most {self.max_model_len - 1} (room for one new token)")
        return text, ids

    def _normalize(self, prompts, sampling_params):
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts; "
                                 "give one SamplingParams or one per prompt")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            p.validate_for(self.config.vocab_size)
        return [self._prompt_ids(p, i) for i, p in enumerate(prompts)], params

    # ---------------------------------------------------------------- public API
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete each prompt. `prompts`: a string, a list of strings, or token-id lists."""
        from tqdm.auto import tqdm

        requests, params = self._normalize(prompts, sampling_params)
        outputs = []
        for (text, ids), p in tqdm(list(zip(requests, params)), desc="generating", unit="prompt",
                                   disable=not use_tqdm):
            request_id = str(next(self._request_ids))
            samples = []
            for index in range(p.n):
                seq = Sequence(seq_id=len(samples), prompt_ids=ids, params=p, index=index,
                               eos_token_id=self.tokenizer.eos_token_id, max_model_len=self.max_model_len)
                self.engine.run_sequence(seq, make_generator(sample_seed(p.seed, index)))
                samples.append(seq.to_output())
            outputs.append(RequestOutput(request_id, text, ids, samples, finished=True))
        return outputs

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True):
        """Apply the model's chat template to one conversation (or a list of them), then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if not conversations or any(not c for c in conversations):
            raise ValueError("messages is empty: give a list of {'role': ..., 'content': ...} dicts")
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def get_tokenizer(self):
        return self.tokenizer
