"""A server in a child process on a free loopback port: for the tests, the benchmark and the notebook.

    with ServerProcess("tiny", "--max-num-seqs", "8") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        ...
    server.metric("num_requests_running")     # one value from /metrics
    server.wait_idle()                         # True once nothing runs and no block is held
    server.returncode        # 0 after a clean SIGTERM

The child runs ``python -m minipaged serve MODEL --port 0 ...``; the port the kernel picked is read
from the line the server prints once it listens. Leaving the with-block sends SIGTERM and waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

_READY = re.compile(r"minipaged: serving .* on (http://[\d.]+:\d+)")


class ServerProcess:
    def __init__(self, model: str = "tiny", *args: str, startup_timeout: float = 120.0, env: dict | None = None):
        self.command = [sys.executable, "-m", "minipaged", "serve", model, "--host", "127.0.0.1", "--port", "0",
                        *args]
        self.startup_timeout, self.env = startup_timeout, env
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self.output: list[str] = []  # everything the server printed (stdout and stderr)
        self.returncode: int | None = None

    def start(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env)
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.output.append(line)
                match = _READY.search(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(self.startup_timeout) or self.url is None:
            self.stop(timeout=5)
            raise RuntimeError(f"the server did not start ({' '.join(self.command)}):\n{self.log}")
        return self

    @property
    def log(self) -> str:
        return "".join(self.output)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait (SIGKILL after timeout). Returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.time() + 2
        while time.time() < deadline and not self.output[-1:]:
            time.sleep(0.01)
        self.returncode = self.proc.returncode
        return self.returncode

    # ---- talking to it without a client library (the tests, the notebook)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str]:
        """(status, body text) of GET path."""
        return self._call(urllib.request.Request(self.url + path, headers=headers or {}))

    def post(self, path: str, body, headers: dict | None = None) -> tuple[int, dict]:
        """(status, parsed JSON) of POST path with a JSON body (or raw bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, text = self._call(urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}))
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, {"text": text}

    @staticmethod
    def _call(request) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str) -> float:
        """The value of minipaged:NAME in /metrics (a counter's name ends in _total there)."""
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {text[:200]}")
        for line in text.splitlines():
            if line.startswith(f"minipaged:{name}{{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(f"minipaged:{name} is not in /metrics")

    def wait_idle(self, seconds: float = 20.0) -> bool:
        """Wait until no request runs or waits and the pool holds nothing; False after ``seconds``."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.metric("num_requests_running") == self.metric("num_requests_waiting") == 0 \
                    and self.metric("kv_cache_usage_perc") == 0:
                return True
            time.sleep(0.05)
        return False

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
