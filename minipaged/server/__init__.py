"""Chapter 11: the serving layer. An OpenAI-compatible HTTP server over ``AsyncLLMEngine``.

    python -m minipaged serve smollm2-135m --port 8000          # as `vllm serve`
    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="smollm2-135m", prompt="Hello", max_tokens=16)

    api.py             the routes (FastAPI), errors in OpenAI's shape, streaming as server-sent events
    protocol.py        request bodies -> SamplingParams, and the response bodies
    metrics_export.py  /metrics in Prometheus's format (prometheus_client)
    dashboard.py       /dashboard: the KV pool live (dashboard.html)
    serve.py           the command: uvicorn, and a SIGTERM that aborts what runs and frees every block
"""

__all__ = ["build_app"]


def __getattr__(name):  # FastAPI is imported only when the server is used, not by every command
    if name == "build_app":
        from minipaged.server.api import build_app

        return build_app
    raise AttributeError(name)
