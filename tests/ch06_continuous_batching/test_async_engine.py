"""The asynchronous front end: requests from many coroutines, stepped by a background thread, each
streaming through its own queue; the event loop keeps running while the engine computes."""

import asyncio

import pytest

from minipaged import LLM, AsyncEngineArgs, AsyncLLMEngine, SamplingParams
from minipaged.metrics_reader import find
from minipaged.sampling_params import RequestOutputKind

PROMPTS = ["The cat sat on", "Paging splits memory into", "Once upon a time there", "KV blocks of sixteen"]
OPTIONS = dict(kv_policy="on_demand", block_size=4, kv_capacity_tokens=96, watermark=0.0)  # preemptions too


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model="tiny", progress=False, **OPTIONS))
    yield e
    e.shutdown()


def test_concurrent_streams_equal_the_offline_call_and_the_loop_stays_free(engine):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def main():
        first_token = asyncio.Event()  # the others arrive once s0 decodes, however fast a step is
        ticks = 0

        async def one(i):
            if i:
                await first_token.wait()
                await asyncio.sleep(0)
            ids = []
            async for out in engine.generate(PROMPTS[i], params, request_id=f"s{i}"):
                ids += out.outputs[0].token_ids
                first_token.set()
            return ids

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
        tick.cancel()
        return results, ticks

    streamed, ticks = asyncio.run(main())
    offline = LLM("tiny", progress=False, **OPTIONS).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=30,
                                                                                         ignore_eos=True),
                                                                use_tqdm=False)
    assert streamed == [o.outputs[0].token_ids for o in offline]
    assert ticks > 10, "the event loop was blocked while the engine stepped"
    assert find(engine.get_metrics(), "num_preemptions").value > 0, "the pool was meant to run dry"


def test_a_client_that_leaves_aborts_its_request_and_a_bad_one_is_refused(engine):
    async def leave_after(n):
        got = 0
        async for _ in engine.generate("Leaving early", SamplingParams(max_tokens=60, ignore_eos=True,
                                                                       output_kind=RequestOutputKind.DELTA)):
            got += 1
            if got == n:
                break
        return got

    async def main():
        with pytest.raises(ValueError, match="stop_token_ids"):  # outside the vocabulary: the model says no
            async for _ in engine.generate("x", SamplingParams(stop_token_ids=[10 ** 6])):
                pass
        with pytest.raises(ValueError, match="empty"):
            async for _ in engine.generate("", SamplingParams(max_tokens=3)):
                pass
        left = await leave_after(3)
        ok = [o async for o in engine.generate("Still served", SamplingParams(max_tokens=4, ignore_eos=True))]
        for _ in range(200):  # the abort lands at the thread's next pass
            if not engine.engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        return left, ok

    left, ok = asyncio.run(main())
    assert left == 3 and ok[-1].finished and len(ok[-1].outputs[0].token_ids) == 4
    e = engine.engine
    assert not e.has_unfinished_requests() and not e.policy.seq_ids()
    assert find(e.get_metrics(), "num_requests_aborted").value >= 1
    e.policy.check_invariants()
