"""``AsyncLLMEngine``: the online engine for asyncio code (the server, chapter 11), with vLLM's names.

    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model="smollm2-135m"))
    async for out in engine.generate("Hello", SamplingParams(max_tokens=16), request_id="r1"):
        print(out.outputs[0].text)              # RequestOutput after each step that changed it
    await engine.abort("r1")

An engine step is blocking CPU work (a forward pass takes tens to hundreds of milliseconds), so it
must not run on the event loop: a background thread owns the ``LLMEngine`` and steps it while any
request is unfinished, and sleeps otherwise. Coroutines talk to it through two lists guarded by a
lock (requests to add, requests to abort) and get their outputs through a queue per request,
filled with ``loop.call_soon_threadsafe``. Only the thread touches the engine, so the core stays
single-threaded.

Each request's prompt and SamplingParams are checked in the caller before anything is queued: a
bad one raises ValueError from ``generate`` at once, and the other requests never see it. A client
that stops iterating (a closed connection cancels its task) aborts its request, so its blocks go
back to the pool at the next step. An exception inside a step (a bug, not bad input) is raised in
every waiting ``generate``, the engine gives every block back, and the thread goes on serving.

Whoever wants to look inside the engine (the server's /metrics and /dashboard) asks the thread:
``await engine.inspect(fn)`` runs ``fn(llm_engine)`` between two steps and returns its result, so
no other thread ever reads the engine's books while a step changes them.

``stop()`` is the graceful end (the server calls it on SIGTERM): new requests are refused with
``EngineStopped``, every running one is aborted and its ``generate`` raises ``RequestAborted``
(the server ends such a stream with finish_reason "abort"), and every block goes back to the pool.

Which thread steps. By default a background thread started here. The server passes
``background=False`` and calls ``run()`` on the process's main thread, with the event loop in a
thread of its own: on a CPU, torch's OpenMP workers spin-wait between operations only for the main
thread's team, and a step run from any other thread is slower (``bench online`` measures what the
server costs against offline ``generate``).

Tracing the hand-offs. ``engine.trace``, None by default, may be set to a function
``trace(event, request_id, seconds)`` (``seconds`` from ``time.perf_counter()``); it is called, on
the thread where each happens, at:

    "queued"      generate put the request on the list for the engine thread     (event loop)
    "added"       the engine thread gave it to the engine                         (engine thread)
    "step_start", "step_end"   around each engine step (request_id None)          (engine thread)
    "put"         an output of the request was handed to the event loop           (engine thread)
    "got"         generate took that output off the request's queue                (event loop)

It only observes: chapter 11's figure of a server run draws it (plots/explain_serving.py). It must
be quick, must not raise and must not call the engine ("queued" is called with the engine's lock
held, so that it always comes before "added").

Not handled yet: several engine processes, back-pressure (a bounded number of waiting requests),
priorities.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import threading
import time

from minipaged.config import AsyncEngineArgs, EngineArgs
from minipaged.llm_engine import LLMEngine


class RequestAborted(Exception):
    """Raised in ``generate`` when the engine aborted the request (it is stopping)."""


class EngineStopped(RuntimeError):
    """Raised by ``generate`` once ``stop()`` was called: the engine takes no new requests."""


USAGE_HISTORY = 600  # (time, KV usage) samples kept for the dashboard: a few minutes at one per step
IDLE_POLL = 0.2  # seconds an idle engine sleeps before it looks at request_stop again
USAGE_PERIOD = 0.1  # seconds between two samples at most one per step


class AsyncLLMEngine:
    def __init__(self, args: EngineArgs, background: bool = True):
        self.engine = LLMEngine(args)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._adds: list[tuple] = []  # (request_id, prompt, params) for the thread to add
        self._aborts: list[str] = []
        self._inspections: list[tuple] = []  # (fn, concurrent Future) to run between two steps
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = False
        self._stopping = False
        self._stopped: concurrent.futures.Future | None = None
        self._stop_requested = False  # set by request_stop (a signal handler), acted on by the loop
        self.usage_history: collections.deque = collections.deque(maxlen=USAGE_HISTORY)
        self.trace = None  # trace(event, request_id, seconds) at each hand-off (see the module docstring)
        self._sample_usage(force=True)
        self._thread = threading.Thread(target=self._run, name="minipaged-engine", daemon=True)
        self._looping = False  # whether some thread is in _run
        if background:
            self._thread.start()

    def run(self) -> None:
        """Step the engine on the calling thread until ``shutdown()`` (with ``background=False``)."""
        if self._thread.is_alive():
            raise RuntimeError("this engine already steps in its background thread")
        self._run()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> AsyncLLMEngine:
        if not isinstance(engine_args, EngineArgs):
            raise ValueError(f"engine_args must be AsyncEngineArgs, got {type(engine_args).__name__}")
        return cls(engine_args)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_metrics(self) -> list:
        return self.engine.get_metrics()

    # ---- the client side (coroutines on the event loop) ------------------------------------------

    async def generate(self, prompt, sampling_params=None, request_id: str | None = None):
        """Add a request and yield its RequestOutputs as the engine makes them (each carries what its
        SamplingParams.output_kind asks for); the last one has ``finished`` True."""
        request_id = request_id if request_id is not None else f"async-{next(self._ids)}"
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id={request_id!r} must be a non-empty string")
        self.engine.check_request(prompt, sampling_params)  # ValueError here, before anything is queued
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine is shutting down and takes no new requests")
            if request_id in self._queues:
                raise ValueError(f"request_id={request_id!r} is already running; give each request its own id")
            self._queues[request_id] = (loop, queue)
            self._adds.append((request_id, prompt, sampling_params))
            self._trace("queued", request_id)  # under the lock: before the thread can take it
        self._wake.set()
        finished = False
        try:
            while not finished:
                out = await queue.get()
                if isinstance(out, BaseException):
                    raise out
                self._trace("got", request_id)
                finished = out.finished
                yield out
        finally:
            if not finished:  # the client went away (or an error): free the request's memory
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are back in the pool after the engine's next step at the latest."""
        with self._lock:
            self._aborts.append(request_id)
            self._queues.pop(request_id, None)
        self._wake.set()

    async def inspect(self, fn):
        """``fn(llm_engine)``, run by the engine thread between two steps; its result (or exception)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._inspections.append((fn, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    @property
    def is_running(self) -> bool:
        """Whether the engine thread is alive (the server's /health)."""
        return self._looping and not self._stop

    def request_stop(self) -> None:
        """Like ``stop`` but without waiting, and without taking a lock, so that a signal handler on
        the engine's own thread may call it: the engine aborts everything at its next pass (at most
        IDLE_POLL seconds away when idle); ``await wait_stopped()`` waits for that."""
        self._stop_requested = True

    async def wait_stopped(self) -> None:
        while self._looping and not (self._stopped is not None and self._stopped.done()):
            await asyncio.sleep(0.01)

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new requests, abort every running one (its ``generate`` raises RequestAborted) and
        wait until the engine thread has given every block back (``request_stop``, then wait)."""
        self.request_stop()
        self._wake.set()
        deadline = time.time() + timeout
        while self._looping and not (self._stopped is not None and self._stopped.done()):
            if time.time() > deadline:
                raise TimeoutError(f"the engine did not stop within {timeout} s")
            time.sleep(0.01)

    def shutdown(self) -> None:
        """Stop the background thread (the engine and its memory go with the object)."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _trace(self, event: str, request_id: str | None) -> None:
        if self.trace is not None:
            self.trace(event, request_id, time.perf_counter())

    # ---- the engine side (the background thread) -------------------------------------------------

    def _deliver(self, request_id: str, item) -> None:
        with self._lock:
            target = self._queues.get(request_id)
            if target is not None and (isinstance(item, BaseException) or item.finished):
                del self._queues[request_id]
        if target is not None:
            loop, queue = target
            self._trace("put", request_id)
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _sample_usage(self, force: bool = False) -> None:
        now = time.time()
        if force or not self.usage_history or now - self.usage_history[-1][0] >= USAGE_PERIOD:
            self.usage_history.append((now, self.engine.core.kv_cache_usage()))

    def _inspect(self, inspections) -> None:
        for fn, future in inspections:
            try:
                result = fn(self.engine)
            except BaseException as e:  # handed to whoever asked
                future.set_exception(e)
            else:
                future.set_result(result)

    def _abort_clients(self) -> None:
        """After abort_all: every request still waiting for outputs gets RequestAborted."""
        with self._lock:
            waiting = list(self._queues)
        for request_id in waiting:
            self._deliver(request_id, RequestAborted(f"request {request_id!r} was aborted: the engine is stopping"))

    def _run(self) -> None:
        self._looping = True
        try:
            self._loop()
        finally:
            self._looping = False

    def _loop(self) -> None:
        engine = self.engine
        while not self._stop:
            if self._stop_requested and self._stopped is None:
                self._stopped = concurrent.futures.Future()
                with self._lock:
                    self._stopping = True
                    self._inspections.append((lambda e: e.abort_all(), self._stopped))
            with self._lock:
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
                inspections, self._inspections = self._inspections, []
                stopping = self._stopping
            for request_id in aborts:
                engine.abort_request(request_id)
            for request_id, prompt, params in adds:
                if request_id in aborts or stopping:
                    continue
                try:
                    engine.add_request(request_id, prompt, params)
                except ValueError as e:  # checked by the caller already; a race such as a reused id
                    self._deliver(request_id, e)
                    continue
                self._trace("added", request_id)
            if aborts or adds:
                self._sample_usage(force=True)
            self._inspect(inspections)
            if stopping:
                self._abort_clients()
            if not engine.has_unfinished_requests():
                if not inspections:
                    self._wake.wait(IDLE_POLL)
                self._wake.clear()
                continue
            try:
                self._trace("step_start", None)
                outputs = engine.step()
                self._trace("step_end", None)
            except Exception as e:  # a bug in a step: tell everyone waiting, give every block back
                with self._lock:
                    waiting = list(self._queues)
                engine.abort_all()
                for request_id in waiting:
                    self._deliver(request_id, RuntimeError(f"the engine step failed: {e!r}"))
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
            self._sample_usage()


__all__ = ["AsyncLLMEngine", "AsyncEngineArgs", "RequestAborted", "EngineStopped"]
