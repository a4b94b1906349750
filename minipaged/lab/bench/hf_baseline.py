"""HF Transformers' `generate` with padded static batches: the baseline a paged server is measured against.

Requests are cut into batches of a fixed size in arrival order. Each batch is left-padded to its
longest prompt and decodes until its longest request has all its tokens: a request that needs 10
tokens waits (and keeps its KV memory) while a neighbour generates 400. That is static batching,
and its cost is what continuous batching removes.

Every request asks for exactly its own output length (EOS is suppressed, as `ignore_eos` does in
minipaged), so both systems produce the same number of useful tokens. The tokens a request decodes
past its own length are waste and are not counted as output.

Not handled: sampling, streaming, HF's own continuous-batching server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class HFResult:
    batch_size: int
    seconds: float
    requests: int
    output_tokens: int  # useful tokens only (each request's own length)
    decoded_tokens: int  # everything the batches decoded, padding rows included
    latencies: list  # seconds from the start until each request's batch returned

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def load_hf_model(dtype="float32"):
    """The same SmolLM2 GGUF file, loaded by HF Transformers (None if transformers is missing)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    from minipaged.model.fetch import gguf_path

    path = gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=getattr(torch, dtype))
    return model.eval()


def run_padded(model, prompts: list[list[int]], output_lens: list[int], batch_size: int,
               pad_token_id: int = 0, progress: bool = False) -> HFResult:
    import torch
    from tqdm import tqdm

    start = time.perf_counter()
    decoded, latencies = 0, []
    batches = range(0, len(prompts), batch_size)
    for i in tqdm(batches, desc=f"HF generate, batch {batch_size}", disable=not progress):
        chunk, lens = prompts[i:i + batch_size], output_lens[i:i + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in chunk])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        new = max(lens)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad_token_id)
        decoded += new * len(chunk)
        latencies += [time.perf_counter() - start] * len(chunk)  # generate returns the batch at once
    return HFResult(batch_size, time.perf_counter() - start, len(prompts), sum(output_lens), decoded, latencies)
