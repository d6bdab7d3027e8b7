"""ARModule.loop_limit: a module ends its Loop call from what its side inputs hold (the Qwen3-Omni Talker's
audio capped by its text's length). Here a consumer may speak twice as many tokens as the text rows it
read, once the text has ended: below the call's own budget, that limit ends it, streamed or not."""

from __future__ import annotations

import asyncio

import torch

from mstar.conductor import Conductor, Request
from mstar.sampling_params import SamplingParams
from support.conductor_helpers import config, run
from support.toy_graphs import fed_loop_graph
from support.toy_models import FedLM, RowsLM

PER_ROW = 2


class LimitedFedLM(FedLM):
    def loop_limit(self, call) -> int | None:
        if "text" in call.open_inputs:
            return None  # the text is still coming
        text = call.inputs.get("text")
        return PER_ROW * (0 if text is None else text.shape[0])


def request(i: int, consume: int, after: bool = False) -> Request:
    g = torch.Generator().manual_seed(i)
    prompt, prompt2 = torch.randint(1, 97, (3 + i,), generator=g), torch.randint(1, 97, (2,), generator=g)
    return Request(
        {"prompt": prompt, "prompt2": prompt2},
        SamplingParams(),
        meta={"produce": 5 + i, "consume": consume, "after": after},
    )


def test_a_module_ends_its_loop_by_its_side_inputs_streamed_or_not():
    budgets = [(0, 200), (1, 200), (2, 200), (0, 3)]  # the last: the call's own budget binds first
    requests = [request(i, consume) for i, consume in budgets]

    async def main():
        async with Conductor(
            fed_loop_graph(), {"producer": RowsLM(delay_s=0.005), "consumer": LimitedFedLM()}, config=config()
        ) as c:
            streamed = await asyncio.gather(*(c.submit(r).collect() for r in requests))
            after = [await c.submit(request(i, consume, after=True)).collect() for i, consume in budgets]
            await c.wait_idle()
            return streamed, after

    streamed, after = run(main())
    for got in (streamed, after):
        for out, r in zip(got, requests):
            rows = len(out["text"]) - 1  # the producer's last token is never computed: no row
            assert len(out["spoken"]) == min(r.meta["consume"], PER_ROW * rows)
    assert [[int(t) for t in o["spoken"]] for o in streamed] == [[int(t) for t in o["spoken"]] for o in after]
