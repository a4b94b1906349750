"""From options to parts: the model, the KV policy, the runner and the core that ``EngineArgs`` choose.

    core, loaded = build_core(EngineArgs(model="tiny", kv_policy="on_demand"))

``LLMEngine`` calls it once, at load. Every chapter's stage is a choice made here or in the core
(the scheduler, core.py): ``kv_policy`` picks a policy from kv/ (``"per_request"``, chapter 00's,
also picks the ``PerRequestRunner``), ``attention_backend`` and ``cpu_kernels`` what the
``ModelRunner`` attends and multiplies with, ``preemption_mode="swap"`` gives it swap tensors. The
pool holds ``kv_capacity_tokens`` tokens; ``EngineArgs.check_pool`` refuses one that the device's
free memory (``free_bytes``) cannot hold, before anything is allocated.
"""

from __future__ import annotations

from minipaged.config import EngineArgs
from minipaged.core import EngineCore


def free_bytes(device: str) -> int | None:
    """Memory free on a device now: the host's available RAM for "cpu", the GPU's free memory for CUDA."""
    if device == "cpu":
        try:
            with open("/proc/meminfo") as f:
                info = dict(line.split(":", 1) for line in f)
            return int(info["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            import os

            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return None


def build_core(args: EngineArgs, loaded=None, metrics=None) -> tuple[EngineCore, object]:
    """The model, the KV policy and the runner that ``args`` (validated) choose, in one core.
    Returns (core, loaded)."""
    from minipaged.config import GROWING_POLICIES
    from minipaged.kv.factory import make_policy
    from minipaged.kv.swap import swap_blocks_for
    from minipaged.metrics import engine_metrics
    from minipaged.model import load_model
    from minipaged.per_request_runner import PerRequestRunner
    from minipaged.runner import ModelRunner

    metrics = metrics if metrics is not None else engine_metrics()  # the runner counts its block copies there
    if loaded is None:
        loaded = load_model(args.model, dtype=args.dtype, seed=args.seed, progress=args.progress, device=args.device)
    max_model_len = args.resolve(loaded.config.max_model_len)
    cfg = loaded.config
    bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * loaded.model.dtype.itemsize  # K and V
    if args.pooled and args.cpu_kernels:
        _pack_weights(loaded.model)  # before the pool is sized: the packed copy takes memory too
    args.check_pool(max_model_len, bytes_per_token, free_bytes)
    if args.pooled:
        options = {"watermark": args.watermark} if args.kv_policy in GROWING_POLICIES else {}
        policy = make_policy(args.kv_policy, num_slots=args.kv_capacity_tokens, block_size=args.block_size,
                             max_model_len=max_model_len, reservation=args.reservation, **options)
        runner = ModelRunner(loaded.model, policy, attention_backend=args.attention_backend,
                             cpu_kernels=args.cpu_kernels, swap_blocks=swap_blocks_for(args, policy), metrics=metrics)
    else:
        from minipaged.kv.per_request import UnboundedPolicy

        policy = UnboundedPolicy(max_model_len)
        runner = PerRequestRunner(loaded.model, policy, use_cache=args.use_cache)
    core = EngineCore(args, policy, runner, loaded.tokenizer, loaded.tokenizer.eos_token_id, max_model_len, metrics)
    return core, loaded


def _pack_weights(model) -> None:
    """Lay out every weight for the compiled product now (model/llama.py's ``Linear.packed``), when the
    model will use it (``kernels.use``: float32 on the CPU, with the kernels built)."""
    from minipaged.model import kernels
    from minipaged.model.llama import Linear

    with kernels.enabled():
        used = kernels.use(next(model.parameters()))
    if used:
        for module in model.modules():
            if isinstance(module, Linear):
                module.packed()
