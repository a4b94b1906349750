"""A memory map of the KV pool over time, from a simulator ``Timeline``.

x is the step, y the position in the pool (slot, or block for the paged policies). Each request has
its own hue: full color where its slots hold tokens, a pale tint where they are reserved for tokens
still to come, dark orange past its real end (internal fragmentation). Free slots are white, or red
when the waiting request cannot use them (external fragmentation).
"""

from __future__ import annotations

from minipaged.lab.plots.style import TERM_COLORS, TERM_LABELS, save

PALE = 0.4  # how much of the owner's hue a reserved-but-unused cell keeps


def _rgb(hex_color: str) -> tuple[float, float, float]:
    return tuple(int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))


def memory_map_image(timeline):
    """The timeline as an RGB array [cells, steps, 3] (numpy)."""
    import numpy as np
    from matplotlib import colormaps

    from minipaged.lab.simulator.sim import EXTERNAL, FREE, INTERNAL, RESERVED, TOKEN

    owner = np.array(timeline.owner, dtype=np.int64).T  # [cells, snapshots]
    state = np.array(timeline.state, dtype=np.int64).T
    # The dark tab20 hues minus red, orange and pink, which mean fragmentation here; cycling by 3
    # gives requests admitted one after another different hues.
    palette = colormaps["tab20"].colors
    dark = [palette[i] for i in (0, 4, 8, 10, 14, 16, 18)]
    hues = np.array([dark[(i * 3) % len(dark)] for i in range(len(dark))])
    own = hues[np.where(owner >= 0, owner, 0) % len(hues)]  # [cells, snapshots, 3]
    image = np.ones(owner.shape + (3,))
    image[state == TOKEN] = own[state == TOKEN]
    image[state == RESERVED] = PALE * own[state == RESERVED] + (1 - PALE)  # pale tint of the owner
    image[state == INTERNAL] = _rgb(TERM_COLORS["internal"])
    image[state == EXTERNAL] = _rgb(TERM_COLORS["external"])
    image[state == FREE] = 1.0
    return image


def plot_memory_map(timeline, path: str | None = None, title: str | None = None):
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if timeline is None or not timeline.steps:
        raise ValueError("timeline is empty: run simulate(..., timeline_steps=N) with N > 0")
    image = memory_map_image(timeline)
    cells = image.shape[0]
    fig = Figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    first, last = timeline.steps[0], timeline.steps[-1]
    ax.imshow(image, aspect="auto", origin="lower", interpolation="nearest",
              extent=(first - 0.5, last + 0.5, 0, cells * timeline.cell_slots))
    ax.set_xlabel("step")
    unit = "slot" if timeline.block_size == 1 else f"slot (blocks of {timeline.block_size})"
    ax.set_ylabel(f"KV pool position: {unit}")
    ax.set_title(title or f"memory map: {timeline.policy}")
    blue = _rgb("#1f77b4")
    legend = [Patch(color=blue, label="tokens (one hue per request)"),
              Patch(color=tuple(PALE * c + 1 - PALE for c in blue), label="reserved, not yet used (pale)"),
              Patch(color=TERM_COLORS["internal"], label=TERM_LABELS["internal"]),
              Patch(color=TERM_COLORS["external"], label=TERM_LABELS["external"] + " (free, unusable)"),
              Patch(facecolor="white", edgecolor="#999999", label="free")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save(fig, path)
