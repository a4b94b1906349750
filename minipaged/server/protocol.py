"""The OpenAI wire format: request bodies in, response bodies and stream chunks out.

    body = CompletionRequest.model_validate(json)        # field types (pydantic): a 400 naming the field
    prompts, params = completion_inputs(body)             # SamplingParams: the engine's own checks
    completion_response(body, request_id, outputs)        # the JSON the openai client expects

A request goes through two checks before any work starts. pydantic checks each field's type,
strictly (a string where a number belongs, ``true`` for an integer, an unknown ``stream_options``
key); then ``SamplingParams`` and the
engine check the values (``top_p=2``, a token id outside the vocabulary), with the same ValueError
messages ``LLM.generate`` gives. The server turns both into OpenAI's error shape with status 400.

The sampling fields keep OpenAI's names and defaults (temperature 1.0, max_tokens 16 for completions
and "up to the context length" for chat); vLLM's extra fields top_k, min_tokens, ignore_eos,
stop_token_ids, min_p, skip_special_tokens and repetition_penalty are accepted too, as ``vllm serve``
does. presence_penalty, frequency_penalty and logit_bias mean what they mean in OpenAI's API and in
vLLM (``minipaged/sampling.py``; a bias is clamped to [-100, 100], as vLLM does). OpenAI fields that
this engine does not implement (tools, response formats, ...) are accepted at their neutral value
and refused otherwise, so that a client never silently gets something else than it asked for.

Not handled yet: ``echo``, ``suffix``, ``best_of``, tools and function calling, response formats,
images and audio in messages (a message's content must be text, or a list of text parts).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from minipaged.sampling_params import RequestOutputKind, SamplingParams


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Request(BaseModel):
    """Fields both endpoints share. Unknown fields are kept (OpenAI clients send a few extra ones,
    such as ``user``) but the known unsupported ones are checked by ``_refuse_unsupported``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    n: StrictInt = 1
    seed: StrictInt | None = Field(None, ge=0)  # OpenAI's seeds are non-negative
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # vLLM's extra sampling fields
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    repetition_penalty: StrictFloat | None = None
    # OpenAI's penalties and bias
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    logit_bias: dict[str, StrictFloat] | None = None  # token id (a string, as JSON keys are) -> bias
    user: str | None = None


class CompletionRequest(_Request):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class TokenizeCompletionRequest(BaseModel):
    """POST /tokenize with a prompt, as vLLM's server takes it."""
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(BaseModel):
    """POST /tokenize with chat messages: the prompt the chat template makes of them."""
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[StrictInt]


MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat's top_logprobs (completions' logprobs: EngineArgs.max_logprobs)
ROLES = ("system", "developer", "user", "assistant", "tool")  # the roles OpenAI's chat API knows


def _refuse(field: str, value, why: str):
    raise ValueError(f"{field}={value!r} is not supported: {why}")


def _refuse_unsupported(body: _Request) -> None:
    if body.stream_options is not None and not body.stream:
        raise ValueError("stream_options is only allowed with stream=true")


def _sampling_params(body: _Request, max_tokens, logprobs, stream: bool) -> SamplingParams:
    """The engine's SamplingParams from a body (ValueError naming the field when a value is bad)."""
    fields = dict(n=body.n, temperature=1.0 if body.temperature is None else body.temperature,
                  top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                  min_p=body.min_p or 0.0, seed=body.seed, stop=body.stop, stop_token_ids=body.stop_token_ids,
                  ignore_eos=body.ignore_eos, max_tokens=max_tokens, min_tokens=body.min_tokens,
                  skip_special_tokens=body.skip_special_tokens,
                  include_stop_str_in_output=body.include_stop_str_in_output, logprobs=logprobs,
                  presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                  repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
                  logit_bias=body.logit_bias,
                  output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
    return SamplingParams(**fields)


def completion_inputs(body: CompletionRequest) -> tuple[list, SamplingParams]:
    """The prompts (each a string or a list of token ids) and SamplingParams of /v1/completions."""
    _refuse_unsupported(body)
    if body.echo:
        _refuse("echo", True, "echoing the prompt is not implemented; leave it out")
    if body.suffix is not None:
        _refuse("suffix", body.suffix, "insertion (a suffix) is not implemented")
    if body.best_of not in (None, body.n):
        _refuse("best_of", body.best_of, "best_of must equal n (or be left out): samples are not ranked here")
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise ValueError("prompt is empty: give a string, a list of strings, or a list of token ids")
    return prompts, _sampling_params(body, body.max_tokens, body.logprobs, body.stream)


def chat_inputs(body: ChatCompletionRequest) -> tuple[list[dict], SamplingParams]:
    """The messages (as {'role', 'content'} dicts of text) and SamplingParams of /v1/chat/completions."""
    _refuse_unsupported(body)
    if body.tools:
        _refuse("tools", "[...]", "tool calling is not implemented")
    if body.response_format not in (None, {"type": "text"}):
        _refuse("response_format", body.response_format, "only {'type': 'text'} is implemented")
    if body.max_tokens is not None and body.max_completion_tokens is not None \
            and body.max_tokens != body.max_completion_tokens:
        raise ValueError(f"max_tokens={body.max_tokens} and max_completion_tokens={body.max_completion_tokens} "
                         "disagree; send one of them (max_completion_tokens is OpenAI's current name)")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if body.top_logprobs is not None:
        if not body.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs={body.top_logprobs} is not allowed: an integer in [0, {MAX_TOP_LOGPROBS}]")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return chat_messages(body.messages), _sampling_params(body, max_tokens, logprobs, body.stream)


def chat_messages(body_messages: list[ChatMessage]) -> list[dict]:
    """The messages as {'role', 'content'} dicts of text; ValueError naming the message at fault."""
    messages = []
    for i, m in enumerate(body_messages):
        if m.role not in ROLES:
            raise ValueError(f"messages[{i}].role={m.role!r} is not allowed: one of {', '.join(map(repr, ROLES))}")
        content = m.content
        if isinstance(content, list):  # OpenAI's content parts: only text ones here
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}].content[{j}] has type {part.get('type')!r}; only "
                                     "{'type': 'text', 'text': ...} parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        messages.append({"role": m.role, "content": content or ""})
    return messages


def tokenize_inputs(body: TokenizeCompletionRequest | TokenizeChatRequest, tokenizer) -> list[int]:
    """The token ids /tokenize answers with: the prompt's, or those of the chat template's text.

    The engine never adds special tokens to a prompt (SmolLM2 has no BOS to prepend), so
    ``add_special_tokens`` changes nothing here; it is accepted because vLLM's clients send it.
    """
    if isinstance(body, TokenizeChatRequest):
        if body.continue_final_message:
            _refuse("continue_final_message", True, "continuing the last message is not implemented")
        return tokenizer.encode(tokenizer.apply_chat_template(chat_messages(body.messages),
                                                              body.add_generation_prompt))
    return tokenizer.encode(body.prompt)


# ---------------------------------------------------------------- responses

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _ranked(top: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(top.items(), key=lambda kv: -kv[1])[:k]


def completion_logprobs(tokenizer, token_ids, steps, k: int, text_offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs`` object: per token its text, log-probability, offset and the
    k most likely alternatives (``steps`` holds one {token id: logprob} dict per token)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for token, top in zip(token_ids, steps):
        piece = tokenizer.decode([token])
        tokens.append(piece)
        token_logprobs.append(top.get(token))
        alternatives: dict[str, float] = {}
        for t, lp in _ranked(top, k):  # two tokens can show as the same text (e.g. "\ufffd"): keep the likelier
            alternatives.setdefault(tokenizer.decode([t]), lp)
        tops.append(alternatives)
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, token_ids, steps, k: int) -> dict:
    """OpenAI's chat ``logprobs`` object: ``content`` holds one entry per token."""
    content = []
    for token, top in zip(token_ids, steps):
        piece = tokenizer.decode([token])
        content.append({"token": piece, "logprob": top.get(token), "bytes": list(piece.encode("utf-8")),
                        "top_logprobs": [{"token": (p := tokenizer.decode([t])), "logprob": lp,
                                          "bytes": list(p.encode("utf-8"))} for t, lp in _ranked(top, k)]})
    return {"content": content}


def envelope(kind: Literal["text_completion", "chat.completion", "chat.completion.chunk"], request_id: str,
             model: str, created: int | None = None) -> dict:
    return {"id": request_id, "object": kind, "created": created or int(time.time()), "model": model}
