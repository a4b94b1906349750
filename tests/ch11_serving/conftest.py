"""A real server in a child process on a free loopback port, and clients for it."""

import pytest

from minipaged.lab.server_process import ServerProcess

# The tiny random model: fast, and its byte tokenizer still has a chat template.
OPTIONS = ("--max-num-seqs", "64", "--kv-capacity-tokens", "4096")


@pytest.fixture(scope="module")
def server():
    with ServerProcess("tiny", *OPTIONS) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def async_client(server):
    openai = pytest.importorskip("openai")
    return lambda: openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline():
    """The same engine offline, for the equalities (same options as the server)."""
    from minipaged import LLM

    return LLM("tiny", progress=False, max_num_seqs=64, kv_capacity_tokens=4096)
