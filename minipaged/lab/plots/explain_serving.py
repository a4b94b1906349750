"""Explanatory figure of chapter 11: the hand-offs between the HTTP event loop and the engine thread.

    trace = trace_server()              three streaming /v1/completions requests, started a few
                                        milliseconds apart, through the real FastAPI app
                                        (server/api.py) over the real AsyncLLMEngine with the tiny model
    plot_server_swimlanes(trace, path=...)  one lane for the engine thread's steps, one per request:
                                        arrived, queued for the engine thread, added to the engine,
                                        each output put on the request's queue, each SSE event sent

The app is called as an ASGI application, in this process, with no socket: the request's body comes
from ``receive`` and every chunk the app sends is timed in ``send``. The engine's own hand-offs come
from ``AsyncLLMEngine.trace`` (async_engine.py). Times are wall-clock and differ from run to run;
the order of the hand-offs is what the figure shows.

Not handled: chat completions (the same path), several choices per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from minipaged.lab.plots.style import save

SERVER_PROMPTS = ["The block table maps", "Paged attention keeps", "A scheduler decides"]
SERVER_MAX_TOKENS = 8
SERVER_STAGGER_S = 0.015  # seconds between two requests' arrivals


@dataclass
class ServerTrace:
    t0: float
    requests: list[str]  # the engine's request ids, in arrival order
    events: list[tuple[str, str | None, float]] = field(default_factory=list)  # (event, request_id, seconds)
    texts: dict[str, str] = field(default_factory=dict)  # what each client received, joined

    def times(self, event: str, request_id: str | None = None) -> list[float]:
        """Seconds since t0 of every ``event`` of ``request_id``."""
        return [t - self.t0 for e, r, t in self.events if e == event and r == request_id]


async def _call(app, path: str, body: dict, trace: ServerTrace, tag: str) -> None:
    """POST ``body`` to ``path`` of the ASGI ``app``; record "arrived" and each SSE event "sent"."""
    raw = json.dumps(body).encode()
    done = asyncio.Event()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await done.wait()  # the client stays connected until the response ends
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] != "http.response.body":
            return
        for line in message.get("body", b"").decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                request_id = f"{chunk['id']}-0"  # the engine's request for the request's prompt 0
                trace.events.append(("sent", request_id, time.perf_counter()))
                trace.texts[request_id] = trace.texts.get(request_id, "") + chunk["choices"][0]["text"]
        if not message.get("more_body", False):
            done.set()

    trace.events.append(("arrived", tag, time.perf_counter()))
    await app(scope, receive, send)


def trace_server(prompts=SERVER_PROMPTS, max_tokens: int = SERVER_MAX_TOKENS,
                 stagger_s: float = SERVER_STAGGER_S) -> ServerTrace:
    from minipaged.async_engine import AsyncLLMEngine
    from minipaged.config import EngineArgs
    from minipaged.server.api import build_app

    engine = AsyncLLMEngine(EngineArgs(model="tiny", max_model_len=128, kv_capacity_tokens=1024))
    trace = ServerTrace(time.perf_counter(), [])
    engine.trace = lambda event, request_id, seconds: trace.events.append((event, request_id, seconds))
    app = build_app(engine, "tiny")
    body = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}

    async def clients():
        tasks = []
        for i, prompt in enumerate(prompts):
            tasks.append(asyncio.create_task(_call(app, "/v1/completions", {**body, "prompt": prompt}, trace,
                                                   f"http-{i}")))
            await asyncio.sleep(stagger_s)
        await asyncio.gather(*tasks)

    try:
        trace.t0 = time.perf_counter()
        asyncio.run(clients())
    finally:
        engine.shutdown()
    trace.requests = list(dict.fromkeys(r for e, r, _ in trace.events if e == "queued"))
    return trace


EVENT_STYLE = {  # event -> (marker, color, label)
    "arrived": ("v", "#424242", "HTTP request arrived (event loop)"),
    "queued": ("s", "#f9a825", "queued for the engine thread"),
    "added": ("D", "#6a1b9a", "added to the engine (engine thread)"),
    "put": ("o", "#1565c0", "output put on the request's queue (engine thread)"),
    "sent": ("^", "#2e7d32", "SSE event sent (event loop)"),
}


def plot_server_swimlanes(trace: ServerTrace, path: str | None = None, title: str | None = None):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = len(trace.requests)
    fig = Figure(figsize=(10, 1.0 * n + 2.8))
    ax = fig.subplots()
    ms = 1000.0
    starts, ends = trace.times("step_start"), trace.times("step_end")
    for a, b in zip(starts, ends):
        ax.broken_barh([(a * ms, (b - a) * ms)], (-0.35, 0.7), facecolors="#90a4ae", edgecolor="white")
    lanes = {r: i + 1 for i, r in enumerate(trace.requests)}
    arrivals = [t - trace.t0 for e, r, t in trace.events if e == "arrived"]
    for i, r in enumerate(trace.requests):
        y = lanes[r]
        ax.axhline(y, color="#eeeeee", lw=6, zorder=0)
        if i < len(arrivals):
            m, c, _ = EVENT_STYLE["arrived"]
            ax.plot(arrivals[i] * ms, y - 0.25, m, color=c, ms=7)
        for event in ("queued", "added", "put", "sent"):
            m, c, _ = EVENT_STYLE[event]
            offset = {"queued": -0.25, "added": 0.0, "put": 0.0, "sent": -0.25}[event]  # event loop above the lane
            xs = [t * ms for t in trace.times(event, r)]
            ax.plot(xs, [y + offset] * len(xs), m, color=c, ms=6, ls="none")
        puts = trace.times("put", r)
        for sent in trace.times("sent", r):  # each event comes from the last output put before it
            put = max((p for p in puts if p <= sent), default=None)
            if put is not None:
                ax.plot([put * ms, sent * ms], [y, y - 0.25], color="#9e9e9e", lw=0.8)
    ax.set_yticks([0] + [lanes[r] for r in trace.requests],
                  ["engine thread:\nsteps"] + [f"request {i}\n(stream)" for i in range(n)])
    ax.set_ylim(n + 0.6, -0.6)
    ax.set_xlabel("milliseconds since the first request arrived")
    ax.set_title(title or "Serving: the event loop hands requests to the engine thread, which hands each "
                          "step's outputs back", fontsize=10)
    handles = [Patch(facecolor="#90a4ae", label="engine step (forward pass)")]
    handles += [Line2D([], [], marker=m, color=c, ls="none", label=label) for m, c, label in EVENT_STYLE.values()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False, fontsize=9)
    return save(fig, path)
