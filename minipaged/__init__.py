"""minipaged: a small LLM engine that teaches how PagedAttention manages KV-cache memory.

The public names follow vLLM's, so a script moves to vLLM by changing one import:

    from minipaged import LLM, SamplingParams

They are imported lazily, so the bookkeeping modules (allocators, block tables, the simulator)
can be used and tested without loading torch.
"""

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "LLM":
        from minipaged.llm import LLM

        return LLM
    if name == "SamplingParams":
        from minipaged.sampling_params import SamplingParams

        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from minipaged import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'minipaged' has no attribute {name!r}")
