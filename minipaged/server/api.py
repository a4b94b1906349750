"""The OpenAI-compatible HTTP server: FastAPI routes over one ``AsyncLLMEngine``.

    app = build_app(AsyncLLMEngine(EngineArgs(model="tiny")), served_model_name="tiny")
    uvicorn.run(app, host="127.0.0.1", port=8000)        # what `python -m minipaged serve` does

Routes:

    POST /v1/completions        prompt (a string, strings, token ids)  -> text_completion
    POST /v1/chat/completions   messages, through the model's chat template -> chat.completion
    GET  /v1/models             the one model served
    POST /tokenize              a prompt or chat messages -> {count, max_model_len, tokens, token_strs}
    POST /detokenize            {tokens} -> {prompt}: vLLM's two helper routes (benchmark clients use
                                /tokenize to size their prompts)
    GET  /health                200 while the engine thread runs
    GET  /metrics               the engine's metrics in Prometheus's text format (metrics_export.py)
    GET  /dashboard             the live view of the KV pool (dashboard.py); /dashboard/state is its data

Each prompt becomes one engine request with its n samples, so a completion with 3 prompts and n=2
has 6 choices, numbered prompt by prompt. With ``stream: true`` the reply is server-sent events:
one ``data: {json}`` chunk per sample that got new text in an engine step (the samples interleave,
told apart by ``index``), exactly one chunk per sample carrying its ``finish_reason``, with
``stream_options.include_usage`` a last chunk with ``choices: []`` and the usage, then
``data: [DONE]``. The engine streams DELTA outputs, so a chunk never shows text that a stop string
takes back later (llm_engine.py holds such text back).

Everything is checked before the engine sees the request (protocol.py, then the engine's own
checks): a bad field is a 400 whose message is the engine's ValueError, in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``, and so is a body that is not a JSON object. An
unknown model is a 404, a body over ``max_body_bytes`` a 413. With ``--api-key``, every route asks for
the key (401 without it) but ``/health`` and ``/metrics``, which stay open for load balancers and
Prometheus scrapers as vLLM's do, and the dashboard's static page (its data, /dashboard/state, asks).
A client that hangs up (mid-stream or while waiting for a whole answer) aborts its requests: their
blocks go back at the engine's next pass.

Not handled yet: several models or LoRA adapters, the embeddings and responses endpoints,
request priorities, rate limits, TLS.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from minipaged.async_engine import AsyncLLMEngine, EngineStopped, RequestAborted
from minipaged.server import protocol
from minipaged.server.protocol import ChatCompletionRequest, CompletionRequest

MAX_BODY_BYTES = 4 * 2**20  # 4 MiB: far more than a prompt of max_model_len tokens needs

_PARAM = re.compile(r"^(?:SamplingParams\.)?([A-Za-z_][\w.\[\]']*?)(?=[=\s:]|$)")
# what pydantic adds to an error's location inside a union ("prompt", "list[int]", 2): not a field
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|.*-.*)$")
_PROMPT_KINDS = "a string, a list of strings, a list of token ids, or a list of token-id lists"


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def error_response(status: int, message: str, type_: str, param=None, code=None) -> JSONResponse:
    """OpenAI's error body."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


def bad_request(e: ValueError) -> APIError:
    """A ValueError from the checks as a 400; ``param`` is the field the message starts with."""
    message = str(e)
    match = _PARAM.match(message)
    return APIError(400, message, "invalid_request_error", match.group(1) if match else None)


def _body_message(error: dict) -> str:
    """What is wrong with a request body that FastAPI could not turn into fields."""
    if error.get("type") == "json_invalid":
        why = (error.get("ctx") or {}).get("error")
        return ("the request body is not valid JSON" + (f" ({why})" if why else "")
                + ": send a JSON object with Content-Type: application/json")
    if error.get("type") == "missing":
        return "the request body is empty: send a JSON object with Content-Type: application/json"
    return "the request body must be a JSON object (with Content-Type: application/json)"


def sse(data) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


# ---------------------------------------------------------------- middleware (pure ASGI)

class Guard:
    """Refuses a request before FastAPI reads it: 401 without the API key (every path but /health,
    /metrics and the dashboard's static page), 413 when the body is larger than max_body_bytes
    (checked on Content-Length, and counted while a body without one arrives)."""

    OPEN_PATHS = ("/health", "/metrics", "/dashboard")

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"] not in self.OPEN_PATHS:
            if headers.get("authorization") != f"Bearer {self.api_key}":
                return await error_response(401, "missing or wrong API key: send the header "
                                            "'Authorization: Bearer <key>' (the key given to --api-key)",
                                            "authentication_error", code="invalid_api_key")(scope, receive, send)
        length = headers.get("content-length")
        too_big = error_response(413, f"the request body is larger than {self.max_body_bytes} bytes",
                                 "invalid_request_error", code="request_too_large")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await too_big(scope, receive, send)
        seen, refused = 0, False

        async def counted_receive():  # a body without Content-Length: refuse it once it grows too large
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    refused = True
                    await too_big(scope, receive, send)
                    return {"type": "http.disconnect"}  # the app stops reading; what it answers is dropped
            return message

        async def guarded_send(message):
            if not refused:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)


# ---------------------------------------------------------------- the app

def build_app(engine: AsyncLLMEngine, served_model_name: str, api_key: str | None = None,
              max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    from minipaged.server import dashboard, metrics_export

    app = FastAPI(title="minipaged", description="An OpenAI-compatible server over minipaged's engine.")
    app.state.engine, app.state.model_name = engine, served_model_name
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes)
    tokenizer = engine.get_tokenizer()
    exporter = metrics_export.PrometheusExporter(engine, served_model_name)
    created = int(time.time())  # when the model was served: /v1/models says so, as vLLM's does

    # -- errors in OpenAI's shape
    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return error_response(e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_, e: RequestValidationError):
        first = e.errors()[0]
        whole_body = tuple(first.get("loc", ())) in (("body",), ("body", 1)) or first.get("type") == "json_invalid"
        if whole_body:  # not a field's fault: the body is not JSON, not an object, or missing
            return error_response(400, _body_message(first), "invalid_request_error")
        loc = [p for p in first.get("loc", ()) if p != "body"]
        fields = [str(p) for p in loc if isinstance(p, int) or not _UNION_MEMBER.match(str(p))]
        param = fields[0] if fields else None
        where = ".".join(fields) or "the body"
        if param == "prompt":
            message = f"prompt must be {_PROMPT_KINDS}"
        else:
            message = f"{where}: {first.get('msg', 'is not valid')}"
        if fields and "input" in first and param != "messages":
            message += f" (got {first['input']!r:.80})"
        return error_response(400, message, "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail), "invalid_request_error" if e.status_code < 500
                              else "internal_error")

    def check_model(name: str | None) -> None:
        if name is not None and name != served_model_name:
            raise APIError(404, f"model={name!r} does not exist; this server serves {served_model_name!r} "
                                "(GET /v1/models lists it)", "invalid_request_error", "model", "model_not_found")

    def checked(body, inputs):
        """The model name, then ``inputs(body)`` (protocol.py): a 404 or a 400 before any work."""
        check_model(body.model)
        try:
            return inputs(body)
        except ValueError as e:
            raise bad_request(e) from None

    def check_prompts(prompts, params) -> list[list[int]]:
        """Each prompt as token ids, checked by the engine, with room for max_tokens after it (vLLM's
        server refuses a request longer than the context too): a 400 before anything is queued."""
        try:
            where = "prompt" if len(prompts) == 1 else "prompt[{}]"
            ids = [engine.engine.check_request(p, params, where.format(i))[1] for i, p in enumerate(prompts)]
            limit, longest = engine.engine.max_model_len, max(len(p) for p in ids)
            if params.max_tokens is not None and longest + params.max_tokens > limit:
                raise ValueError(f"max_tokens={params.max_tokens} is too many: the prompt has {longest} tokens and "
                                 f"max_model_len={limit} leaves room for at most {limit - longest} new ones")
            return ids
        except ValueError as e:
            raise bad_request(e) from None

    # -- the model list and health
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": created,
                                            "owned_by": "minipaged", "max_model_len": engine.engine.max_model_len}]}

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.is_running else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(await exporter.render(), media_type=metrics_export.CONTENT_TYPE)

    # -- vLLM's tokenizer routes
    @app.post("/tokenize")
    async def tokenize(body: dict[str, Any]):
        kind = protocol.TokenizeChatRequest if "messages" in body else protocol.TokenizeCompletionRequest
        if kind is protocol.TokenizeCompletionRequest and not isinstance(body.get("prompt"), str):
            raise APIError(400, f"prompt must be a string (got {body.get('prompt')!r:.80}), or send messages "
                                "instead", "invalid_request_error", "prompt")
        try:
            request = kind.model_validate(body)
        except ValidationError as e:  # the same 400 as a bad field of the other routes
            raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
        ids = checked(request, lambda r: protocol.tokenize_inputs(r, tokenizer))
        strs = [tokenizer.id_to_token(i) for i in ids] if request.return_token_strs else None
        return {"count": len(ids), "max_model_len": engine.engine.max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: protocol.DetokenizeRequest):
        check_model(body.model)
        vocab = engine.engine.config.vocab_size
        for i, token in enumerate(body.tokens):
            if not 0 <= token < vocab:
                raise APIError(400, f"tokens[{i}]={token} is not in the vocabulary: ids lie in [0, {vocab})",
                               "invalid_request_error", "tokens")
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    @app.get("/dashboard")
    async def dashboard_page():
        return HTMLResponse(dashboard.page())

    @app.get("/dashboard/state")
    async def dashboard_state():
        return await engine.inspect(lambda e: dashboard.pool_state(e, engine.usage_history))

    # -- completions
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompts, params = checked(body, protocol.completion_inputs)
        ids = check_prompts(prompts, params)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        k = body.logprobs
        model = body.model or served_model_name

        def choice(prompt_index, c):
            out = {"index": prompt_index * params.n + c.index, "text": c.text,
                   "logprobs": None, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if k is not None:
                out["logprobs"] = protocol.completion_logprobs(tokenizer, c.token_ids, c.logprobs or [], k)
            return out

        if body.stream:
            def chunk(prompt_index, c):
                return {**protocol.envelope("text_completion", request_id, model), "choices": [choice(prompt_index, c)]}

            return _stream(engine, request_id, ids, params, chunk, None, body, model, "text_completion")
        finals = await _collect(engine, request, request_id, ids, params)
        return {**protocol.envelope("text_completion", request_id, model),
                "choices": [choice(i, c) for i, out in enumerate(finals) for c in out.outputs],
                "usage": _usage(finals)}

    # -- chat completions
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        messages, params = checked(body, protocol.chat_inputs)
        prompt = tokenizer.apply_chat_template(messages, True)
        ids = check_prompts([prompt], params)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        k = body.top_logprobs or 0
        model = body.model or served_model_name

        def logprobs_of(c):
            return protocol.chat_logprobs(tokenizer, c.token_ids, c.logprobs or [], k) if body.logprobs else None

        if body.stream:
            def chunk(_, c):
                return {**protocol.envelope("chat.completion.chunk", request_id, model),
                        "choices": [{"index": c.index, "delta": {"content": c.text} if c.text else {},
                                     "logprobs": logprobs_of(c), "finish_reason": c.finish_reason}]}

            def first(index):  # the role comes once per choice, before its content
                return {**protocol.envelope("chat.completion.chunk", request_id, model),
                        "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]}

            return _stream(engine, request_id, ids, params, chunk, first, body, model,
                           "chat.completion.chunk")
        finals = await _collect(engine, request, request_id, ids, params)
        return {**protocol.envelope("chat.completion", request_id, model),
                "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                             "logprobs": logprobs_of(c), "finish_reason": c.finish_reason,
                             "stop_reason": c.stop_reason} for c in finals[0].outputs],
                "usage": _usage(finals)}

    return app


def _usage(finals) -> dict:
    return protocol.usage(sum(len(o.prompt_token_ids) for o in finals),
                          sum(len(c.token_ids) for o in finals for c in o.outputs),
                          sum(o.num_cached_tokens for o in finals))


async def _merged(engine: AsyncLLMEngine, request_id: str, ids, params):
    """(prompt index, RequestOutput) from every prompt's request, in the order they come. Leaving
    the loop early (a hang-up) cancels the readers, which aborts their requests."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def read(i, prompt_ids):
        try:
            async for out in engine.generate({"prompt_token_ids": prompt_ids}, params, request_id=f"{request_id}-{i}"):
                await queue.put((i, out))
        except BaseException as e:  # noqa: B036 - handed to the consumer, which re-raises it
            await queue.put((i, e))
            return
        await queue.put((i, done))

    readers = [asyncio.create_task(read(i, p)) for i, p in enumerate(ids)]
    try:
        left = len(readers)
        while left:
            i, item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(engine, request: Request, request_id: str, ids, params) -> list:
    """The finished RequestOutput of every prompt; a hang-up first cancels (and aborts) them."""

    async def gather():
        finals = [None] * len(ids)
        async for i, out in _merged(engine, request_id, ids, params):
            if out.finished:
                finals[i] = out
        return finals

    work, hangup = asyncio.create_task(gather()), asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait([work, hangup], return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
    if not work.done():  # the client is gone: nobody to answer
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise APIError(499, "the client closed the connection", "client_closed")
    try:
        return work.result()
    except RequestAborted as e:
        raise APIError(503, f"{e}; retry on another server", "server_shutting_down") from None
    except EngineStopped as e:
        raise APIError(503, str(e), "server_shutting_down") from None


def _stream(engine, request_id, ids, params, chunk, first, body, model, kind) -> StreamingResponse:
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    async def events():
        finished: set[int] = set()  # choices whose finish_reason was sent
        prompt_tokens = completion_tokens = cached = 0
        n, wants_logprobs = params.n, params.logprobs is not None
        if first is not None:
            for index in range(len(ids) * n):
                yield sse(first(index))
        try:
            async for i, out in _merged(engine, request_id, ids, params):
                for c in out.outputs:  # choice c of prompt i: its delta since the last output
                    # exercise 11.2: begin
                    index = i * n + c.index
                    if index in finished:
                        continue
                    completion_tokens += len(c.token_ids)
                    if c.finish_reason is not None:
                        finished.add(index)
                    elif not c.text and not (wants_logprobs and c.token_ids):  # text held back: nothing to show
                        continue
                    yield sse(chunk(i, c))
                    # exercise 11.2: end
                if out.finished:
                    prompt_tokens += len(out.prompt_token_ids)
                    cached += out.num_cached_tokens
        except (RequestAborted, EngineStopped):  # the server is stopping: end each open choice
            for index in range(len(ids) * n):
                if index not in finished:
                    yield sse(_abort_chunk(kind, request_id, model, index))
        if include_usage:
            yield sse({**protocol.envelope(kind, request_id, model), "choices": [],
                       "usage": protocol.usage(prompt_tokens, completion_tokens, cached)})
        yield sse("[DONE]")

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _abort_chunk(kind: str, request_id: str, model: str, index: int) -> dict:
    choice = {"index": index, "logprobs": None, "finish_reason": "abort"}
    choice.update({"delta": {}} if kind == "chat.completion.chunk" else {"text": ""})
    return {**protocol.envelope(kind, request_id, model), "choices": [choice]}
