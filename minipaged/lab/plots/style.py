"""Colors shared by the figures, so a term looks the same in every plot."""

TERM_COLORS = {
    "tokens": "#2e7d32",  # green: slots doing useful work
    "reserved": "#f9a825",  # amber: held for tokens still to come
    "internal": "#ef6c00",  # orange: held past the request's end, never filled
    "external": "#c62828",  # red: free, but in holes too small for the waiting request
    "free": "#e0e0e0",  # grey: free and usable
}

TERM_LABELS = {
    "tokens": "tokens",
    "reserved": "reserved, not yet used",
    "internal": "internal fragmentation",
    "external": "external fragmentation",
    "free": "free",
}


def save(fig, path):
    if path:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
