"""``python -m minipaged serve MODEL``: the engine behind an OpenAI-compatible HTTP server.

    python -m minipaged serve smollm2-135m --port 8000 --api-key secret --max-num-seqs 32
    python -m minipaged serve tiny --kv-policy contiguous --scheduler static    # an earlier stage

Every field of ``EngineArgs`` is a flag (``--kv-capacity-tokens``, ``--block-size``,
``--enable-prefix-caching`` / ``--no-enable-prefix-caching``, ``--preemption-mode``, ...), as
``vllm serve`` spells them, so any stage of the course can be served and measured. The server
listens on 127.0.0.1 unless ``--host`` says otherwise.

Shutdown. On SIGTERM (or Ctrl-C) the server stops accepting connections, the engine aborts every
running request (each open stream ends with finish_reason "abort"), every block goes back to the
pool, the books are checked (``check_invariants(idle=True)``) and the process exits with status 0.
A second Ctrl-C exits at once.

Not handled yet: several worker processes, TLS, reloading.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import threading

log = logging.getLogger("minipaged.serve")


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minipaged.config import EngineArgs

    p.add_argument("model", nargs="?", default="smollm2-135m",
                   help="'smollm2-135m' (default), 'smollm2-135m-random', 'tiny' or a .gguf path")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: MODEL)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (default: 4 MiB)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="uvicorn's and the server's logging (default: warning; info also logs every request)")
    engine = p.add_argument_group("engine options (EngineArgs; see minipaged/config.py)")
    defaults = EngineArgs()
    for f in dataclasses.fields(EngineArgs):
        if f.name.startswith("_") or f.name in ("model", "progress"):
            continue
        default = getattr(defaults, f.name)
        if f.name == "speculative_config":
            engine.add_argument(_flag_name(f.name), type=_json, default=None,
                                help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'')
        elif isinstance(default, bool) or f.name == "enable_prefix_caching":
            engine.add_argument(_flag_name(f.name), action=argparse.BooleanOptionalAction, default=default,
                                help=f"default: {'the policy decides' if default is None else default}")
        else:
            kind = {"int": int, "float": float, "str": str}.get(type(default).__name__, _int_or_str)
            if f.name in ("max_num_batched_tokens", "swap_space_tokens", "max_model_len"):
                kind = int
            engine.add_argument(_flag_name(f.name), type=kind, default=default, help=f"default: {default}")


def _json(text: str):
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None


def _int_or_str(text: str):
    return int(text) if text.lstrip("-").isdigit() else text


def engine_args(args):
    from minipaged.config import AsyncEngineArgs, EngineArgs

    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs)
               if not f.name.startswith("_") and f.name not in ("model", "progress")}
    options["progress"] = False
    return AsyncEngineArgs(model=args.model, **options)  # LLMEngine validates it, once


def main(args) -> int:
    import uvicorn

    from minipaged.async_engine import AsyncLLMEngine
    from minipaged.server.api import MAX_BODY_BYTES, build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    # the engine steps on this (the main) thread, where torch's OpenMP workers serve it best;
    # the event loop runs in a thread of its own
    engine = AsyncLLMEngine(engine_args(args), background=False)  # a ValueError here: exit 2 with the message
    app = build_app(engine, args.served_model_name or args.model, api_key=args.api_key,
                    max_body_bytes=args.max_body_bytes or MAX_BODY_BYTES)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=10, access_log=args.log_level in ("debug", "info"))
    server = _server(config, engine)

    def on_signal(sig, frame):  # runs on the main thread between two steps: only set flags here
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True
        engine.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    http = threading.Thread(target=server.run, name="minipaged-http")
    http.start()
    engine.run()  # until the server's shutdown calls engine.shutdown()
    http.join()
    try:
        engine.engine.check_invariants(idle=True)
    except AssertionError as e:
        log.error("the engine's books disagree after shutdown: %s", e)
        return 1
    print("minipaged: stopped; every KV block is back in the pool", flush=True)
    return server.exit_code


def _server(config, engine):
    """uvicorn's Server, run off the main thread (so it installs no signal handlers: main does),
    whose shutdown aborts everything the engine runs and then ends the engine's loop."""
    import uvicorn

    class Server(uvicorn.Server):
        exit_code = 0

        async def shutdown(self, sockets=None):
            engine.request_stop()
            await super().shutdown(sockets)
            await engine.wait_stopped()
            engine.shutdown()

        def _log_started_message(self, listeners):
            super()._log_started_message(listeners)
            for sock in listeners:  # the port a test (or --port 0) needs, on stdout whatever the log level
                host, port = sock.getsockname()[:2]
                print(f"minipaged: serving {app_model(config)} on http://{host}:{port}", flush=True)

    return Server(config)


def app_model(config) -> str:
    app = config.app
    return getattr(getattr(app, "state", None), "model_name", "the model")
