"""Chapter 10's GPU figure, from its record (``gpu_check.json``'s results): where the kernels sit under
the H200's roofs.

Left, the roofline at the target shape (SmolLM2, batch 64, 2,048 cached tokens, fp16): FLOP/s against
FLOPs per byte, the datasheet's bandwidth and fp32 roofs, the ceilings the same run measured (numba
reading 2-, 4- or 8-byte words, the paged read), and each timed call as a point. Right, every shape of
the grid: the share of peak bandwidth each call reached against the bytes it had to move, with the
same ceilings as lines.
"""

from __future__ import annotations

from minipaged.lab.plots.style import save

COLORS = {"numba": "#0d47a1", "numba_v1": "#ef6c00", "numba_v2": "#42a5f5", "sdpa": "#2e7d32",
          "reference": "#9e9e9e"}
PAGED = "#8e24aa"  # the paged-read ceiling, in both panels
EXTRA = ["#6a1b9a", "#ef6c00", "#00838f", "#ad1457"]  # kernels added later (numba_v3, ...)
LABELS = {"numba": "numba backend (auto)", "sdpa": "SDPA, contiguous K/V", "reference": "naive reference"}


def _color(kernel: str, kernels: list[str]) -> str:
    if kernel in COLORS:
        return COLORS[kernel]
    extra = [k for k in kernels if k not in COLORS]
    return EXTRA[extra.index(kernel) % len(EXTRA)]


def _label(kernel: str) -> str:
    return LABELS.get(kernel, kernel.replace("numba_", "numba ") + " forced")


def plot_kernel_roofline(results: dict, path: str | None = None):
    from matplotlib.figure import Figure

    kernels, grid, target = results["kernels"], results["grid"], results["target"]
    peak = results["peak_gbps"]  # GB/s
    tflops = results.get("peak_fp32_tflops") or 67.0
    c = results.get("ceilings") or {}
    fig = Figure(figsize=(12, 5.2))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.25]})

    # left: the roofline at the target shape
    shape = target["shape"]
    flops = 4 * shape["batch"] * shape["context"] * shape["num_heads"] * shape["head_dim"]
    intensity = flops / shape["bytes"]
    xs = [0.5, tflops * 1e3 / peak, 64]
    ax.plot(xs, [min(x * peak / 1e3, tflops) for x in xs], color="black", lw=1.8,
            label=f"datasheet: {peak / 1e3:.1f} TB/s, {tflops:.0f} fp32 TFLOP/s")
    lines = [(f"numba read, {w}-byte words", g, ls) for (w, g), ls in
             zip((c.get("flat_read_gbps") or {}).items(), (":", "-.", "--"))]
    paged = next((p for p in c.get("paged_read", []) if (p["shape"], p["batch"], p["context"])
                  == ("smollm2", shape["batch"], shape["context"])), None)
    if paged:
        lines.append(("numba paged read, no math", paged["gbps"], (0, (6, 2))))
    for label, gbps, ls in lines:
        ax.plot([0.5, intensity * 4], [0.5 * gbps / 1e3, intensity * 4 * gbps / 1e3], ls=ls, lw=1.1,
                color=PAGED if "paged" in label else "#616161", label=f"{label}: {gbps / 1e3:.2f} TB/s")
    for k in kernels:
        us = target["us_by_kernel"][k]
        style = (dict(ms=14, markerfacecolor="none", markeredgewidth=2, markeredgecolor=_color(k, kernels))
                 if k == "numba" else dict(ms=8, markeredgecolor="black", markeredgewidth=0.5))
        ax.plot([intensity], [flops / us / 1e6], marker="o", ls="none", color=_color(k, kernels), **style,
                label=f"{_label(k)}: {us:,.0f} µs, {target['fraction_by_kernel'][k]:.1%}", zorder=4 - (k == "numba"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(0.5, 64)
    ax.set_ylim(5e-3, 150)
    ax.axvline(intensity, color="#bdbdbd", lw=0.8, zorder=0)
    ax.set_xlabel("FLOPs per byte read")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"SmolLM2, batch {shape['batch']}, {shape['context']:,} cached tokens, fp16: "
                 f"{intensity:.1f} FLOP/B", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right", framealpha=0.95)

    # right: every shape of the grid
    # the backend's own choice is always one of the forced kernels, so the right panel shows those
    shown = [k for k in kernels if k not in ("reference", "numba")] or [k for k in kernels if k != "reference"]
    for k in shown:
        for model, marker in (("smollm2", "o"), ("llama8b", "^")):
            rows = [r for r in grid if r["shape"] == model and k in r["us"]]
            bx.scatter([r["bytes"] / 1e6 for r in rows], [r["fraction_of_peak"][k] for r in rows], s=22,
                       marker=marker, color=_color(k, kernels), edgecolors="black", linewidths=0.3,
                       label=_label(k) if model == "smollm2" else None, zorder=3)
    flat = lines[:-1] if paged else lines
    for i, (label, gbps, ls) in enumerate(flat):
        bx.axhline(gbps / peak, color="#616161", ls=ls, lw=1.1)
        above = i == len(flat) - 1  # the widest word on top, the others under their lines
        bx.text(0.06, gbps / peak * (1.06 if above else 0.94), f"{label}: {gbps / peak:.0%}", fontsize=7,
                color="#424242", va="bottom" if above else "top")
    pts = c.get("paged_read", [])
    if pts:
        bx.scatter([p["bytes"] / 1e6 for p in pts], [p["fraction_of_peak"] for p in pts], marker="*", s=80,
                   color="white", edgecolors=PAGED, linewidths=1.2, label="numba paged read, no math", zorder=4)
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlim(0.05, 2e4)
    bx.set_ylim(2e-4, 1.5)
    bx.set_xlabel("MB the call must read and write (o SmolLM2, ^ Llama-3-8B layer)")
    bx.set_ylabel(f"share of {peak / 1e3:.1f} TB/s reached")
    bx.set_title("every shape of the grid: batch 1-256, context 128-8,192", fontsize=10)
    bx.grid(alpha=0.3, which="both")
    bx.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Decode attention on an {results['device']}, code at {results['commit']}", fontsize=11)
    fig.tight_layout()
    return save(fig, path)
