"""minipaged: a small LLM engine that teaches how PagedAttention manages KV-cache memory.

The public names follow vLLM's, so a script moves to vLLM by changing one import:

    from minipaged import LLM, SamplingParams

They are imported lazily, so the bookkeeping modules (allocators, block tables, the simulator)
can be used and tested without loading torch.
"""

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "LLMEngine", "EngineArgs",
           "AsyncLLMEngine", "AsyncEngineArgs", "RequestOutputKind", "BeamSearchParams"]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "LLM":
        from minipaged.llm import LLM

        return LLM
    if name in ("SamplingParams", "RequestOutputKind", "BeamSearchParams"):
        from minipaged import sampling_params

        return getattr(sampling_params, name)
    if name == "LLMEngine":
        from minipaged.llm_engine import LLMEngine

        return LLMEngine
    if name == "AsyncLLMEngine":
        from minipaged.async_engine import AsyncLLMEngine

        return AsyncLLMEngine
    if name in ("EngineArgs", "AsyncEngineArgs"):
        from minipaged import config

        return getattr(config, name)
    if name in ("RequestOutput", "CompletionOutput"):
        from minipaged import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'minipaged' has no attribute {name!r}")
