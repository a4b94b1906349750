"""The front end: `LLM` with vLLM's names (`generate`, `chat`), so scripts move to vLLM unchanged.

    llm = LLM(model="smollm2-135m")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))
    outs[0].outputs[0].text

The front end checks every prompt and parameter before any work starts (a bad one raises a
ValueError naming the field), turns each prompt into n Sequences and hands them to the engine that
the configuration chose. With the "shared" KV policy the n samples of a prompt are prefilled once and
forked (chapter 05); every other policy runs them as n independent sequences. Sample i always
draws from its own generator seeded with ``sample_seed(seed, i)``, so the outputs are the same either way.

    llm.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=32))   as vLLM's (beam_search.py)

Not handled yet: streaming, async serving, LoRA, multi-modal prompts.
"""

from __future__ import annotations

import itertools
import time

from minipaged.engine import NaiveEngine
from minipaged.kv.factory import ALL_POLICIES, make_policy
from minipaged.model import load_model
from minipaged.outputs import RequestOutput
from minipaged.sampling import make_generator, sample_seed
from minipaged.sampling_params import SamplingParams
from minipaged.sequence import Sequence

KV_POLICIES = ("per_request", *ALL_POLICIES)


def _metrics(group) -> dict:
    """vLLM's RequestOutput.metrics fields (time.perf_counter() seconds): when the request arrived,
    when its first token came and when its last sample finished; and, for inter-token latency
    (chapter 08), when each sample's tokens came (the paged engine records them)."""
    firsts = [s.first_token_time for s in group if s.first_token_time is not None]
    ends = [s.finished_time for s in group if s.finished_time is not None]
    return {"arrival_time": group[0].arrival_time, "first_token_time": min(firsts) if firsts else None,
            "finished_time": max(ends) if len(ends) == len(group) else None,
            "token_times": [list(s.token_times) for s in group]}  # per sample: when each output token came


def _check_scheduling(scheduler, preemption_mode, max_num_batched_tokens, swap_space_tokens,
                      enable_chunked_prefill, kv_policy, max_num_seqs) -> None:
    from minipaged.scheduler import DEFAULT_CHUNKED_BUDGET, PREEMPTION_MODES, SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler={scheduler!r} is not known; choose one of {list(SCHEDULERS)}")
    if preemption_mode not in PREEMPTION_MODES:
        raise ValueError(f"preemption_mode={preemption_mode!r} is not known; choose one of {list(PREEMPTION_MODES)}")
    for name, value, least in (("max_num_batched_tokens", max_num_batched_tokens, 1),
                               ("swap_space_tokens", swap_space_tokens, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name}={value!r} must be an integer >= {least}, or None")
    if not isinstance(enable_chunked_prefill, bool):
        raise ValueError(f"enable_chunked_prefill must be True or False, got {enable_chunked_prefill!r}")
    if not enable_chunked_prefill:
        return
    if kv_policy == "per_request":
        raise ValueError(f"enable_chunked_prefill=True needs a pooled kv_policy, one of {list(KV_POLICIES[1:])}: "
                         "kv_policy='per_request' runs one sequence at a time, so no decode waits on a prompt")
    if scheduler != "continuous":
        raise ValueError(f"enable_chunked_prefill=True needs scheduler='continuous', not {scheduler!r}")
    budget = DEFAULT_CHUNKED_BUDGET if max_num_batched_tokens is None else max_num_batched_tokens
    if isinstance(max_num_seqs, int) and budget < max_num_seqs:
        given = "" if max_num_batched_tokens is not None else " (the chunked-prefill default)"
        raise ValueError(f"max_num_batched_tokens={budget}{given} must be >= max_num_seqs={max_num_seqs} with "
                         "chunked prefill (every running sequence's next token must fit in one step); raise it or "
                         "lower max_num_seqs")


def _check_speculation(config, kv_policy, scheduler, enable_chunked_prefill):
    from minipaged.spec import SpeculativeConfig

    spec = SpeculativeConfig.from_dict(config)
    if spec is None:
        return None
    if kv_policy == "per_request":
        raise ValueError(f"speculative_config needs a pooled kv_policy, one of {list(KV_POLICIES[1:])}: the "
                         "drafts' slots come from the pool, and kv_policy='per_request' has none")
    if scheduler != "continuous":
        raise ValueError(f"speculative_config needs scheduler='continuous', not {scheduler!r}")
    if enable_chunked_prefill:
        raise ValueError("speculative_config together with enable_chunked_prefill=True is not handled yet: "
                         "turn one of them off")
    return spec


class LLM:
    """An offline engine over one model.

    Args:
        model: "smollm2-135m" (the real chat model), "smollm2-135m-random", "tiny", or a .gguf path.
        dtype: "float32" (default; matches the reference implementation token for token), "bfloat16".
        seed: seeds the random weights of "tiny" and "smollm2-135m-random".
        kv_policy: where K and V live.
            "per_request"  (chapter 00) a growing tensor per sequence, one sequence at a time;
            "contiguous"   (chapter 01) one slab per request in a pooled arena, first fit;
            "fixed_blocks" (chapter 02) a contiguous run of fixed-size blocks per request;
            "block_table"  (chapter 03) any free blocks, through a block table, reserved up front;
            "on_demand"    (chapter 04) blocks taken as tokens arrive;
            "shared"       (chapter 05) on_demand with reference-counted blocks and copy-on-write:
                           the n samples of a request share its prompt's blocks, beams share prefixes.
            "prefix_caching" (chapter 07) shared, plus a cache of full blocks keyed by their tokens:
                           requests that begin alike share those blocks, even one after the other.
            Every policy but "per_request" batches sequences in a shared pool (paged_engine.py).
        block_size: tokens per KV block (pooled policies; the contiguous arena uses 1).
        kv_capacity_tokens: size of the KV pool in token slots (pooled policies; default 8192).
        reservation: what reserving policies set aside per request: "max" (max_model_len),
            "pow2" (next power of two of prompt + max_tokens) or "oracle" (prompt + max_tokens).
        attention_backend: "torch" (the reference) or "numba" (chapter 10's kernels).
        max_num_seqs: most sequences running at once (pooled policies).
        scheduler: (chapter 06, pooled policies) "continuous" (default: requests join and leave the
            running batch at every step) or "static" (a batch runs until its longest request ends).
        preemption_mode: what happens to the newest request when the pool runs dry mid-decode:
            "recompute" (free its blocks, prefill it again later) or "swap" (copy its blocks to a
            CPU swap space and back).
        max_num_batched_tokens: most new tokens in one step. Without chunked prefill, None means no
            limit, and a step with nothing else in it always takes the next prompt whole. With it, the
            default is 256 and no step computes more (but for the decodes of a lone request with more
            samples than that).
        enable_chunked_prefill: (chapter 08, scheduler="continuous", pooled policies) compute long
            prompts a chunk per step, after the running sequences' decodes, so that a decode never
            waits for more than max_num_batched_tokens tokens of prompt.
        swap_space_tokens: size of the CPU swap space in token slots (default: kv_capacity_tokens
            with preemption_mode="swap", else 0).
        watermark: fraction of the pool that admission keeps free for the running sequences to grow
            into (on_demand, shared and prefix_caching; default 0.01).
        enable_prefix_caching: (chapter 07) keep full KV blocks findable by their tokens after their
            request is done, so a later prompt that starts the same skips that part of its prefill.
            Needs kv_policy="shared" (blocks must count their holders); the same as
            kv_policy="prefix_caching".
        speculative_config: (chapter 09, scheduler="continuous", pooled policies) guess the next tokens
            of each request and check them in the same forward pass, as vLLM's option:
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
            "prompt_lookup_min": 1}. The guesses come from earlier in the sequence itself.
        use_cache: False recomputes every token's K and V at every step (the oracle for caching).
        max_model_len: longest prompt + output allowed (default: the model's context length).
        device: torch device for the model.
    """

    def __init__(self, model: str = "smollm2-135m", *, dtype="float32", seed: int = 0,
                 kv_policy: str = "per_request", block_size: int = 16, kv_capacity_tokens: int = 8192,
                 reservation: str = "max", attention_backend: str = "torch", max_num_seqs: int = 64,
                 use_cache: bool = True, max_model_len: int | None = None, device: str = "cpu",
                 progress: bool = True, scheduler: str = "continuous", preemption_mode: str = "recompute",
                 max_num_batched_tokens: int | None = None, swap_space_tokens: int | None = None,
                 watermark: float = 0.01, enable_prefix_caching: bool = False,
                 enable_chunked_prefill: bool = False, speculative_config: dict | None = None):
        if kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy={kv_policy!r} is not known; choose one of {list(KV_POLICIES)}")
        if not isinstance(enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True or False, got {enable_prefix_caching!r}")
        if enable_prefix_caching:
            if kv_policy not in ("shared", "prefix_caching"):
                raise ValueError(f"enable_prefix_caching=True needs kv_policy='shared' (cached blocks are shared "
                                 f"by counting their holders); kv_policy={kv_policy!r} cannot share a block")
            kv_policy = "prefix_caching"
        _check_scheduling(scheduler, preemption_mode, max_num_batched_tokens, swap_space_tokens,
                          enable_chunked_prefill, kv_policy, max_num_seqs)
        spec = _check_speculation(speculative_config, kv_policy, scheduler, enable_chunked_prefill)
        loaded = load_model(model, dtype=dtype, seed=seed, progress=progress, device=device)
        self.model, self.tokenizer, self.config = loaded.model, loaded.tokenizer, loaded.config
        if max_model_len is not None and not 1 < max_model_len <= self.config.max_model_len:
            raise ValueError(f"max_model_len={max_model_len} must be in [2, {self.config.max_model_len}]")
        self.max_model_len = max_model_len or self.config.max_model_len
        self.kv_policy = kv_policy
        self.max_num_seqs = max_num_seqs  # beam search batches the same number of beams either way
        if kv_policy == "per_request":
            self.engine = NaiveEngine(self.model, self.tokenizer, use_cache=use_cache)
        else:
            from minipaged.paged_engine import PagedEngine

            if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
                raise ValueError(f"max_num_seqs={max_num_seqs!r} must be an integer >= 1")
            options = {"watermark": watermark} if kv_policy in ("on_demand", "shared", "prefix_caching") else {}
            policy = make_policy(kv_policy, num_slots=kv_capacity_tokens, block_size=block_size,
                                 max_model_len=self.max_model_len, reservation=reservation, **options)
            if swap_space_tokens is None:
                swap_space_tokens = kv_capacity_tokens if preemption_mode == "swap" else 0
            if preemption_mode == "swap" and swap_space_tokens < block_size:
                raise ValueError(f"swap_space_tokens={swap_space_tokens} cannot hold one block of {block_size} "
                                 "tokens; preemption_mode='swap' needs a swap space")
            self.engine = PagedEngine(self.model, self.tokenizer, policy, attention_backend=attention_backend,
                                      max_num_seqs=max_num_seqs, scheduler=scheduler,
                                      preemption_mode=preemption_mode,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      swap_space_tokens=swap_space_tokens,
                                      enable_chunked_prefill=enable_chunked_prefill,
                                      speculative_config=spec)
        self._request_ids = itertools.count()
        self._seq_ids = itertools.count()

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
        from tqdm import tqdm

        requests, params = self._normalize(prompts, sampling_params)
        eos = self.tokenizer.eos_token_id
        groups, now = [], time.perf_counter()  # one list of Sequences per request
        for (_, ids), p in zip(requests, params):
            groups.append([Sequence(seq_id=next(self._seq_ids), prompt_ids=ids, params=p, index=index,
                                    eos_token_id=eos, max_model_len=self.max_model_len, arrival_time=now)
                           for index in range(p.n)])
        generators = {seq.seq_id: make_generator(sample_seed(seq.params.seed, seq.index))
                      for group in groups for seq in group}
        bar = tqdm(total=len(groups), desc="generating", unit="prompt", disable=not use_tqdm)
        if self.kv_policy == "per_request":
            for group in groups:
                for seq in group:
                    self.engine.run_sequence(seq, generators[seq.seq_id])
                bar.update(1)
        else:
            owner = {seq.seq_id: group for group in groups for seq in group}

            def on_finish(seq):
                if all(s.finished for s in owner[seq.seq_id]):
                    bar.update(1)

            if self.engine.policy.shares_blocks:  # prefill each prompt once, fork its other samples
                self.engine.run([group[0] for group in groups], generators, on_finish,
                                forks={group[0].seq_id: group[1:] for group in groups})
            else:
                self.engine.run([seq for group in groups for seq in group], generators, on_finish)
        bar.close()
        return [RequestOutput(str(next(self._request_ids)), text, ids, [seq.to_output() for seq in group],
                              metrics=_metrics(group), num_cached_tokens=group[0].num_cached_tokens)
                for (text, ids), group in zip(requests, groups)]

    def beam_search(self, prompts, params, use_tqdm: bool = False):
        """vLLM's ``LLM.beam_search``: for each prompt, the best params.beam_width sequences found by
        beam search (a list of BeamSearchOutput, one per prompt; see minipaged/beam_search.py).

        kv_policy "shared" keeps the beams in the paged pool, sharing blocks; "per_request" gives
        every beam private K/V, cloned when beams branch (the unshared oracle). Other policies cannot
        fork a sequence and raise a ValueError.
        """
        from tqdm import tqdm

        from minipaged.beam_search import BeamSearch, BeamSearchParams, PagedBeams, PrivateBeams

        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}")
        if self.kv_policy == "per_request":
            backend = PrivateBeams(self.model)
        elif self.engine.policy.shares_blocks:
            backend = PagedBeams(self.engine)
        else:
            raise ValueError(f"beam_search needs kv_policy='shared' (beams share blocks) or 'per_request' "
                             f"(private copies); kv_policy={self.kv_policy!r} cannot fork a sequence")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("prompts is empty: give at least one prompt")
        ids = [self._prompt_ids(p, i)[1] for i, p in enumerate(prompts)]
        mode = getattr(self.engine, "preemption_mode", "recompute")
        search = BeamSearch(backend, params, self.tokenizer.eos_token_id, max_num_seqs=self.max_num_seqs,
                            preemption_mode=mode)
        bar = tqdm(total=len(ids), desc="beam search", unit="prompt", disable=not use_tqdm)
        try:
            outputs = search.run(ids, self.max_model_len, self.tokenizer, on_finish=lambda _: bar.update(1))
        except BaseException:  # interrupted: the beams' blocks go back to the pool
            if isinstance(backend, PagedBeams):
                self.engine.abort_all()
            raise
        finally:
            bar.close()
        return outputs

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True):
        """Apply the model's chat template to one conversation (or a list of them), then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if not conversations or any(not c for c in conversations):
            raise ValueError("messages is empty: give a list of {'role': ..., 'content': ...} dicts")
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block, as vLLM's ``LLM.reset_prefix_cache`` does: the next requests
        start cold. False (nothing to reset) unless the prefix cache is on."""
        policy = getattr(self.engine, "policy", None)
        if policy is None or not policy.caches_prefixes:
            return False
        policy.reset_cache()
        return True

    def get_tokenizer(self):
        return self.tokenizer
