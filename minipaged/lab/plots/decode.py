"""Chapter 00's speed picture: decode tokens/s against batch size, under this CPU's two roofs.

The weight-streaming roof rises with the batch (one read of the weights serves every sequence); the
matmul roof (the step's matmuls alone: at batch 1 a read of the weights as well, from a few sequences
on their arithmetic) rises much more slowly. Below the lower of the two is
all a decode step can reach; the gap between a measured line and that roof is the step's other work.
"""

from __future__ import annotations

from minipaged.lab.plots.style import save


def plot_decode_roofline(result: dict, path: str | None = None):
    """result: ``bench decode``'s result (its "rows": batch, bounds, engine and optionally hf)."""
    from matplotlib.figure import Figure

    rows = result["rows"]
    if not rows:
        raise ValueError("result has no rows: measure at least one batch size")
    batches = [r["batch"] for r in rows]
    reads = [r["read_gbytes_s"] for r in rows]
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    ax.plot(batches, [r["bounds"]["weight_streaming"] for r in rows], color="#9e9e9e", ls="--", lw=1.2,
            label=f"weight-streaming roof (read bandwidth measured beside each point: "
                  f"{min(reads):.0f}-{max(reads):.0f} GB/s)")
    ax.plot(batches, [r["bounds"]["arithmetic"] for r in rows], color="#616161", ls=":", lw=1.5,
            label="matmul roof (the step's matmuls alone; at batch 1 also a read of the weights)")
    ax.plot(batches, [r["engine"]["tokens_per_s"] for r in rows], color="#1565c0", marker="o", lw=1.8,
            label="minipaged LLMEngine")
    if all("hf" in r for r in rows):
        ax.plot(batches, [r["hf"]["tokens_per_s"] for r in rows], color="#c62828", marker="s", lw=1.5,
                label="HF Transformers generate")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel("decode tokens/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"{result['model']} decode on {result['threads']} CPU threads, {result['context']}-token prompts",
                 fontsize=10)
    return save(fig, path)
