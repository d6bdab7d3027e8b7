"""Failure paths: nothing is lost silently, nothing hangs, nothing leaks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request, RequestError
from mstar.engine.config import EngineConfig
from mstar.graph import FixedChunkPolicy
from mstar.sampling_params import SamplingParams
from support.toy_graphs import lm_graph, streaming_lm_graph
from support.toy_models import SumChunk, ToyLM


class FailsOnSecondChunk(SumChunk):
    def prepare_inputs(self, calls):
        if any(c.index == 1 for c in calls):
            raise RuntimeError("bad chunk")
        return super().prepare_inputs(calls)


def test_a_failed_streamed_chunk_fails_the_request():
    async def scenario():
        config = EngineConfig(num_kv_blocks=256, block_size=4, stateless_max_wait_ms=0)
        async with Conductor(
            streaming_lm_graph(FixedChunkPolicy(4)), {"llm": ToyLM(), "sum": FailsOnSecondChunk()}, config=config
        ) as c:
            stream = c.submit(Request({"prompt": torch.tensor([1, 2, 3])}, SamplingParams(max_tokens=200)))
            with pytest.raises(RequestError, match="bad chunk"):
                await stream.collect()
            await c.wait_idle()

    asyncio.run(scenario())


def test_a_request_id_can_be_reused_right_after_it_ends():
    lm = ToyLM()

    async def scenario():
        async with Conductor(lm_graph(), {"llm": lm}, config=EngineConfig(num_kv_blocks=64, block_size=4)) as c:
            for _ in range(10):
                out = await c.submit(
                    Request({"prompt": torch.tensor([5, 6])}, SamplingParams(max_tokens=4), request_id="fixed")
                ).collect()
                assert [int(t) for t in out["token"]] == lm.reference_greedy([5, 6], 4)  # and resubmit at once
            await c.wait_idle()

    asyncio.run(scenario())


def test_stop_with_requests_in_flight_cancels_them_and_detaches():
    async def scenario():
        c = Conductor(lm_graph(), {"llm": ToyLM()}, config=EngineConfig(num_kv_blocks=512, block_size=4))
        await c.start()
        streams = [
            c.submit(Request({"prompt": torch.tensor([i + 1])}, SamplingParams(max_tokens=300))) for i in range(4)
        ]
        await streams[0].__anext__()
        await c.stop()
        assert c.in_flight == 0 and not c.started
        for s in streams:
            with pytest.raises(RequestError):
                await s.collect()
        from mstar.engine.device_loop import device_thread

        assert all(loop not in device_thread()._loops for w in c.workers for loop in [w._loop])

    asyncio.run(scenario())


def test_closing_a_session_fails_its_running_request_clearly():
    async def scenario():
        async with Conductor(lm_graph(), {"llm": ToyLM()}, config=EngineConfig(num_kv_blocks=256, block_size=4)) as c:
            stream = c.submit(Request({"prompt": torch.tensor([1, 2])}, SamplingParams(max_tokens=400), session_id="s"))
            await stream.__anext__()
            c.close_session("s")
            with pytest.raises(RequestError, match="session 's' was closed"):
                await asyncio.wait_for(stream.collect(), timeout=10)
            await c.wait_idle()

    asyncio.run(scenario())


def test_a_sequence_too_big_for_the_pool_fails_instead_of_waiting_forever():
    async def scenario():
        # A loop with a stop value and no max_iters: admission cannot bound it; the pool can.
        from mstar.graph import Call, GraphEdge, GraphNode, Loop, ModelGraph, StopOnValues

        graph = ModelGraph(
            name="unbounded",
            nodes=[GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar")],
            edges=[
                GraphEdge("input.prompt", "llm.input_ids"),
                GraphEdge("llm.token", "llm.input_ids"),
                GraphEdge("llm.token", "output.token"),
            ],
            walks={"prefill": Call("llm"), "decode": Loop("llm", stop=StopOnValues("llm.token", (-1,)))},
            next_walk=lambda s: {None: "prefill", "prefill": "decode"}.get(s.last_walk),
        )
        async with Conductor(graph, {"llm": ToyLM()}, config=EngineConfig(num_kv_blocks=8, block_size=4)) as c:
            with pytest.raises(RequestError, match="cannot hold"):
                await asyncio.wait_for(c.submit(Request({"prompt": torch.tensor([1])})).collect(), timeout=20)
            await c.wait_idle()
        async with Conductor(
            graph, {"llm": ToyLM(max_positions=64)}, config=EngineConfig(num_kv_blocks=64, block_size=4)
        ) as c:
            out = await asyncio.wait_for(c.submit(Request({"prompt": torch.tensor([1])})).collect(), timeout=20)
            assert len(out["token"]) < 64  # it ends at the context limit instead of overflowing it
            await c.wait_idle()

    asyncio.run(scenario())
