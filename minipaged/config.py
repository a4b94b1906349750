"""``EngineArgs``: every option of the engine in one dataclass, checked in one place.

    args = EngineArgs(model="tiny", kv_policy="on_demand", block_size=8)
    args.validate()                 # ValueError naming the field and what is allowed
    LLMEngine.from_engine_args(args)   # validates it once, then passes it whole to the core
    LLM(**options)                  # EngineArgs(**options) -> LLMEngine

The defaults are the finished engine, as vLLM's are: a paged pool of shared, reference-counted
blocks with the prefix cache (chapter 07), continuous batching (chapter 06), decode attention by a
compiled CPU kernel (``attention_backend="cpu"``) and the model's small operations compiled
(``cpu_kernels=True``, model/kernels.py). A chapter that shows an earlier stage chooses it
by name, for example ``EngineArgs(kv_policy="per_request")`` for chapter 00's one-sequence engine.

Each option has its default here, once (a scheduler built by hand reads the same defaults). Adding a
chapter's option means adding a field here, with its check in ``validate``, and reading it where
the engine core or ``build_core`` (build.py) builds the policy, scheduler or runner it
configures. The parts check what they are handed too (a policy its sizes, a scheduler its mode),
for callers that build them by hand, but only ``validate`` knows how the options combine.

What needs the model is checked by ``resolve(model_max_len)``: ``max_model_len`` against the model's
context length. Everything else is checked before any weights are loaded.

Not handled: tensor or pipeline parallelism, LoRA, quantized weights or KV.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from minipaged.sampling_params import _is_int

KV_POLICIES = ("per_request", "contiguous", "fixed_blocks", "block_table", "on_demand", "shared", "prefix_caching")
RESERVING_POLICIES = ("contiguous", "fixed_blocks", "block_table")  # reserve each request's memory up front
GROWING_POLICIES = ("on_demand", "shared", "prefix_caching")  # take blocks as tokens arrive (watermark)
SCHEDULERS = ("continuous", "static")
PREEMPTION_MODES = ("recompute", "swap")
RESERVATIONS = ("max", "pow2", "oracle")
ATTENTION_BACKENDS = ("torch", "torch_batched", "cpu", "numba")
DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_CHUNKED_BUDGET = 256  # tokens per step on a CPU: about 0.6 s for SmolLM2 on 2 cores (bench chunked's fit)


def _fail(name: str, value, allowed: str):
    raise ValueError(f"{name}={value!r} is not allowed: {allowed}")


def _one_of(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not known; choose one of {list(choices)}")


def _int_at_least(name: str, value, least: int, *, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if not _is_int(value) or value < least:
        _fail(name, value, f"an integer >= {least}" + (", or None" if none_ok else ""))


def _flag(name: str, value, *, none_ok: bool = False) -> None:
    if not isinstance(value, bool) and not (none_ok and value is None):
        _fail(name, value, "True or False" + (" (or None for the default)" if none_ok else ""))


@dataclass
class EngineArgs:
    """Every option of the engine. Fields left at None take the default that fits the others.

    model: "smollm2-135m" (the real chat model), "smollm2-135m-random", "tiny", or a .gguf path.
    dtype: "float32" (matches the reference implementation token for token), "float16", "bfloat16".
    seed: seeds the random weights of "tiny" and "smollm2-135m-random".
    kv_policy: where K and V live.
        "per_request"    (chapter 00) a growing tensor per sequence, one sequence at a time;
        "contiguous"     (chapter 01) one slab per request in a pooled arena, first fit;
        "fixed_blocks"   (chapter 02) a contiguous run of fixed-size blocks per request;
        "block_table"    (chapter 03) any free blocks, through a block table, reserved up front;
        "on_demand"      (chapter 04) blocks taken as tokens arrive;
        "shared"         (chapter 05) on_demand with reference-counted blocks and copy-on-write;
        "prefix_caching" (chapter 07) shared, plus a cache of full blocks found again by their tokens.
        None: "prefix_caching", or "shared" when enable_prefix_caching=False.
    block_size: tokens per KV block (pooled policies; the contiguous arena uses 1).
    kv_capacity_tokens: size of the KV pool in token slots.
    reservation: what reserving policies set aside per request: "max" (max_model_len), "pow2" (next
        power of two of prompt + max_tokens) or "oracle" (prompt + max_tokens).
    attention_backend: "cpu" (decodes through a compiled C++ kernel over the paged cache, prompts as
        torch_batched: chapter 10's kernel on a CPU), "torch_batched" (chapter 06's batched PyTorch
        path), "torch" (the reference) or "numba" (chapter 10's kernels; under numba's CUDA simulator
        without a GPU).
    cpu_kernels: run the model's small operations (RMSNorm, RoPE, SwiGLU, the thin products, the cache
        write) as compiled C++ kernels (model/kernels.py; built on first use, the PyTorch code when no
        compiler is there). False runs the model's PyTorch code, their oracle. Pooled policies only.
    max_num_seqs: most sequences running at once; it also bounds SamplingParams.n and a beam search's
        beam_width. With kv_policy="per_request" the scheduler runs one request at a time whatever it
        says (``running_limit``): chapter 00's memory is the one-request loop it teaches.
    max_logprobs: most top tokens a request may ask for at each step (SamplingParams.logprobs), as
        vLLM's (20 by default); -1 allows up to the whole vocabulary.
    scheduler: (chapter 06) "continuous" (requests join and leave the batch at every step) or "static"
        (a batch runs until its longest request ends).
    preemption_mode: (chapter 06) what happens to the newest request when the pool runs dry: "recompute"
        (free its blocks, prefill it again later) or "swap" (to a CPU swap space and back).
    max_num_batched_tokens: most new tokens in one step. Without chunked prefill None means no limit;
        with it the default is 256.
    enable_chunked_prefill: (chapter 08) compute long prompts a chunk per step, beside the decodes.
    swap_space_tokens: size of the CPU swap space in token slots (default: kv_capacity_tokens with
        preemption_mode="swap", else 0).
    watermark: fraction of the pool that admission keeps free for running sequences to grow into
        (on_demand, shared, prefix_caching).
    enable_prefix_caching: (chapter 07) keep full blocks findable by their tokens. None: on for the
        default policy; True needs kv_policy "shared" or "prefix_caching".
    speculative_config: (chapter 09) {"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 4, "prompt_lookup_min": 1}.
    use_cache: False recomputes every token's K/V at every step (chapter 00's oracle; per_request only).
    max_model_len: longest prompt + output allowed (default: the model's context length).
    device: torch device for the model.
    progress: progress bars while the weights load.
    """

    model: str = "smollm2-135m"
    dtype: str = "float32"
    seed: int = 0
    kv_policy: str | None = None
    block_size: int = 16
    kv_capacity_tokens: int = 8192
    reservation: str = "max"
    attention_backend: str = "cpu"
    cpu_kernels: bool = True
    max_num_seqs: int = 64
    max_logprobs: int = 20
    scheduler: str = "continuous"
    preemption_mode: str = "recompute"
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = False
    swap_space_tokens: int | None = None
    watermark: float = 0.01
    enable_prefix_caching: bool | None = None
    speculative_config: dict | None = None
    use_cache: bool = True
    max_model_len: int | None = None
    device: str = "cpu"
    progress: bool = True

    # ---- derived values (valid after validate()) ----------------------------------------------

    @property
    def pooled(self) -> bool:
        """Whether sequences share one KV pool (every policy but chapter 00's per_request)."""
        return self.kv_policy != "per_request"

    @property
    def running_limit(self) -> int:
        """Sequences the scheduler runs at once: max_num_seqs, or 1 for chapter 00's per_request."""
        return self.max_num_seqs if self.pooled else 1

    @property
    def swap_tokens(self) -> int:
        if self.swap_space_tokens is not None:
            return self.swap_space_tokens
        return self.kv_capacity_tokens if self.preemption_mode == "swap" else 0

    @property
    def batched_tokens(self) -> int | None:
        """The step's token budget: the chunked-prefill default when chunks are on."""
        if self.enable_chunked_prefill and self.max_num_batched_tokens is None:
            return DEFAULT_CHUNKED_BUDGET
        return self.max_num_batched_tokens

    @property
    def spec(self):
        """The checked SpeculativeConfig, or None."""
        from minipaged.spec.config import SpeculativeConfig

        return SpeculativeConfig.from_dict(self.speculative_config)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if not f.name.startswith("_")]

    # ---- the one place options are checked ----------------------------------------------------

    def validate(self) -> EngineArgs:
        """Check every field and how they combine; fill in the defaults that depend on others.
        Returns self. A ValueError names the field and what is allowed."""
        if not isinstance(self.model, str) or not self.model:
            _fail("model", self.model, "a model name such as 'smollm2-135m' or 'tiny', or a .gguf path")
        _one_of("dtype", self.dtype, DTYPES)
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            _fail("seed", self.seed, "an integer in [0, 2**63)")
        _flag("enable_prefix_caching", self.enable_prefix_caching, none_ok=True)
        if self.kv_policy is None:
            self.kv_policy = "shared" if self.enable_prefix_caching is False else "prefix_caching"
        _one_of("kv_policy", self.kv_policy, KV_POLICIES)
        if self.enable_prefix_caching:
            if self.kv_policy not in ("shared", "prefix_caching"):
                raise ValueError(f"enable_prefix_caching=True needs kv_policy='shared' (cached blocks are shared "
                                 f"by counting their holders); kv_policy={self.kv_policy!r} cannot share a block")
            self.kv_policy = "prefix_caching"
        elif self.enable_prefix_caching is False and self.kv_policy == "prefix_caching":
            raise ValueError("enable_prefix_caching=False contradicts kv_policy='prefix_caching'; "
                             "use kv_policy='shared' for sharing without the cache")
        self.enable_prefix_caching = self.kv_policy == "prefix_caching"
        _int_at_least("block_size", self.block_size, 1)
        _int_at_least("kv_capacity_tokens", self.kv_capacity_tokens, 1)
        if self.pooled and self.kv_policy != "contiguous" and self.kv_capacity_tokens < self.block_size:
            _fail("kv_capacity_tokens", self.kv_capacity_tokens,
                  f"at least one block of block_size={self.block_size} tokens")
        _one_of("reservation", self.reservation, RESERVATIONS)
        _one_of("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _int_at_least("max_num_seqs", self.max_num_seqs, 1)
        _int_at_least("max_logprobs", self.max_logprobs, -1)
        _one_of("scheduler", self.scheduler, SCHEDULERS)
        _one_of("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _int_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1, none_ok=True)
        _int_at_least("swap_space_tokens", self.swap_space_tokens, 0, none_ok=True)
        _flag("enable_chunked_prefill", self.enable_chunked_prefill)
        _flag("use_cache", self.use_cache)
        _flag("cpu_kernels", self.cpu_kernels)
        _flag("progress", self.progress)
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)) \
                or not 0 <= self.watermark < 1:
            _fail("watermark", self.watermark, "a fraction of the pool in [0, 1)")
        _int_at_least("max_model_len", self.max_model_len, 2, none_ok=True)
        self._check_device()
        self._check_combinations()
        self._check_unused()
        return self

    def _check_device(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            _fail("device", self.device, "a torch device name such as 'cpu' or 'cuda'")
        if self.device == "cpu":
            return
        import torch

        try:
            device = torch.device(self.device)
        except RuntimeError:
            _fail("device", self.device, "a torch device name such as 'cpu', 'cuda' or 'cuda:0'")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} needs CUDA, and this torch build or machine has none "
                             "(torch.cuda.is_available() is False); use device='cpu'")
        if device.type not in ("cpu", "cuda"):
            _fail("device", self.device, "'cpu' or a CUDA device ('cuda', 'cuda:0', ...)")

    def _check_unused(self) -> None:
        """An option set away from its default that the chosen configuration would ignore is an error:
        silently ignoring it would make an experiment measure something other than what it says."""
        defaults = {f.name: f.default for f in fields(self) if not f.name.startswith("_")}
        unused = []
        if not self.pooled:  # chapter 00: no pool at all
            unused += ["block_size", "kv_capacity_tokens", "reservation", "watermark"]
        elif self.kv_policy in RESERVING_POLICIES:
            unused += ["watermark"]  # a reservation is all-or-nothing: nothing grows into the reserve
        else:
            unused += ["reservation"]  # growing policies reserve nothing
        if self.kv_policy == "contiguous":
            unused += ["block_size"]  # the arena's unit is one token slot
        if self.preemption_mode != "swap" and self.swap_space_tokens != 0:  # 0: no swap space, as without swap
            unused += ["swap_space_tokens"]
        for name in unused:
            if getattr(self, name) != defaults[name]:
                raise ValueError(f"{name}={getattr(self, name)!r} has no effect with kv_policy={self.kv_policy!r}"
                                 f", preemption_mode={self.preemption_mode!r}; leave it at its default "
                                 f"({defaults[name]!r}) or choose a configuration that uses it")

    def check_pool(self, max_model_len: int, bytes_per_token: int, free_bytes) -> None:
        """Checks that need the model: the pool and the swap space fit in the memory there is
        (``free_bytes(device)`` says how much a device has free, or None if unknown), and a reserving
        policy's pool holds at least one reservation (with reservation "max" every request reserves
        max_model_len; a smaller pool would refuse them all)."""
        from minipaged.kv.base import blocks_for

        kv = self.kv_capacity_tokens if self.pooled else 0
        if self.device == "cpu":  # the pool and the swap space share the host's memory
            needs = [("cpu", kv + self.swap_tokens, "kv_capacity_tokens + swap_space_tokens" if self.swap_tokens
                      else "kv_capacity_tokens")]
        else:
            needs = [(self.device, kv, "kv_capacity_tokens"), ("cpu", self.swap_tokens, "swap_space_tokens")]
        for device, tokens, what in needs:
            available = free_bytes(device) if tokens else None
            if available is not None and tokens * bytes_per_token > available:
                raise ValueError(f"{what}={tokens} need {tokens * bytes_per_token / 2**30:.1f} GiB of K/V "
                                 f"({bytes_per_token} bytes a token), but {device!r} has "
                                 f"{available / 2**30:.1f} GiB free: at most {available // bytes_per_token} tokens")
        if self.kv_policy in RESERVING_POLICIES and self.reservation == "max":
            unit = 1 if self.kv_policy == "contiguous" else self.block_size
            reservation = blocks_for(max_model_len, unit) * unit
            if reservation > self.kv_capacity_tokens:
                raise ValueError(f"kv_capacity_tokens={self.kv_capacity_tokens} cannot hold one reservation of "
                                 f"{reservation} slots (kv_policy={self.kv_policy!r} with reservation='max' sets "
                                 f"aside max_model_len={max_model_len} per request), so every request would be "
                                 "refused; raise kv_capacity_tokens, lower max_model_len, or use reservation='oracle'")

    def _check_combinations(self) -> None:
        pooled = list(KV_POLICIES[1:])
        if self.attention_backend == "numba" and self.dtype == "bfloat16":
            raise ValueError("attention_backend='numba' runs dtype 'float32' or 'float16', not 'bfloat16'")
        if not self.use_cache and self.pooled:
            raise ValueError(f"use_cache=False (recompute every token) needs kv_policy='per_request'; "
                             f"kv_policy={self.kv_policy!r} keeps K/V in a pool")
        if self.preemption_mode == "swap":
            if self.kv_policy in ("per_request", "contiguous", "fixed_blocks"):
                raise ValueError(f"preemption_mode='swap' needs a block-table policy (block_table, on_demand, "
                                 f"shared, prefix_caching); kv_policy={self.kv_policy!r} cannot detach a "
                                 "request's blocks")
            if self.swap_tokens < self.block_size:
                raise ValueError(f"swap_space_tokens={self.swap_tokens} cannot hold one block of {self.block_size} "
                                 "tokens; preemption_mode='swap' needs a swap space")
        if self.enable_chunked_prefill:
            if not self.pooled:
                raise ValueError(f"enable_chunked_prefill=True needs a pooled kv_policy, one of {pooled}: "
                                 "kv_policy='per_request' runs one sequence at a time, so no decode waits on a prompt")
            if self.scheduler != "continuous":
                raise ValueError(f"enable_chunked_prefill=True needs scheduler='continuous', not {self.scheduler!r}")
            if self.batched_tokens < self.max_num_seqs:
                given = "" if self.max_num_batched_tokens is not None else " (the chunked-prefill default)"
                raise ValueError(f"max_num_batched_tokens={self.batched_tokens}{given} must be >= max_num_seqs="
                                 f"{self.max_num_seqs} with chunked prefill (every running sequence's next token "
                                 "must fit in one step); raise it or lower max_num_seqs")
        if self.spec is not None:
            if not self.pooled:
                raise ValueError(f"speculative_config needs a pooled kv_policy, one of {pooled}: the drafts' "
                                 "slots come from the pool, and kv_policy='per_request' has none")
            if self.scheduler != "continuous":
                raise ValueError(f"speculative_config needs scheduler='continuous', not {self.scheduler!r}")
            if self.enable_chunked_prefill:
                raise ValueError("speculative_config together with enable_chunked_prefill=True is not handled "
                                 "yet: turn one of them off")

    def resolve(self, model_max_len: int) -> int:
        """The max_model_len to use with a model whose context length is model_max_len."""
        if self.max_model_len is not None and self.max_model_len > model_max_len:
            raise ValueError(f"max_model_len={self.max_model_len} must be in [2, {model_max_len}] "
                             "(the model's context length)")
        return self.max_model_len or model_max_len


@dataclass
class AsyncEngineArgs(EngineArgs):
    """The options of the asynchronous engine (the server's): the same as EngineArgs."""
