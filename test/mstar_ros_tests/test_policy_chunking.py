"""Real-time chunking: the seam between consecutive chunks, measured on the served pi0.5."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar_graphs.pi05.frontend import Pi05Policy
from mstar_ros.policy.chunking import ActionChunker

RATE = 10.0
INFERENCE_S = 0.25  # 2.5 control ticks pass while a chunk is computed


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return Pi05Policy.load(progress=False)


def drive(policy: Pi05Policy, smooth: bool, chunks: int = 5):
    """A simulated robot at RATE Hz: requests at the refill threshold, executes while waiting."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 224, 224, 3), generator=g, dtype=torch.uint8)
    state = torch.rand(8, generator=g) * 2 - 1
    chunker = ActionChunker(policy.action_horizon, policy.action_dim, RATE, smooth=smooth)

    async def go():
        history, now = [], 0.0
        async with Conductor(policy.graph(), policy.modules()) as c:
            for k in range(chunks):
                guide, weights = chunker.begin_request(now)
                request = policy.request(images, state, "wipe the table", seed=k, guide=guide, guide_weights=weights)
                (chunk,) = (await c.submit(request).collect())["actions"]
                now += INFERENCE_S
                history.append(chunker.accept(chunk, now))
                while not chunker.needs_request(now):
                    now += 1.0 / RATE
        return history, chunker.tick_at(now)

    history, end = asyncio.run(go())
    executed = chunker.executed_actions(end, history)
    first = history[0][0]
    seams = [start - first for start, _ in history[1:]]
    steps = (executed[1:] - executed[:-1]).norm(dim=-1)  # step i: executed[i] -> executed[i + 1]
    seam_jumps = torch.stack([steps[s - 1] for s in seams])
    inside = torch.ones_like(steps, dtype=torch.bool)
    inside[[s - 1 for s in seams]] = False
    return seam_jumps, steps[inside]


def test_smooth_seams_are_no_larger_than_steps_inside_a_chunk(policy):
    seams, inside = drive(policy, smooth=True)
    assert len(seams) == 4
    assert float(seams.max()) <= float(inside.max()) + 1e-5, (seams, inside.max())


def test_without_guidance_the_seam_jumps(policy):
    smooth, inside = drive(policy, smooth=True)
    rough, _ = drive(policy, smooth=False)
    assert float(rough.mean()) > float(smooth.mean())  # the guide is what keeps the seam small


def test_chunker_rules():
    c = ActionChunker(10, 2, 10.0, refill_at=4)
    assert c.needs_request(0.0)  # nothing to run yet
    guide, w = c.begin_request(0.0)
    assert not c.needs_request(0.0) and float(w.sum()) == 0  # one request at a time; no chunk to guide by
    start, actions = c.accept(torch.arange(20.0).view(10, 2), 0.35)  # ticks 1..3 passed while computing
    assert start == 4 and torch.equal(actions[0], torch.tensor([6.0, 7.0]))
    assert c.remaining(0.35) == 8 and not c.needs_request(0.35)
    assert c.needs_request(0.75)  # 4 left
    guide, w = c.begin_request(0.75)
    assert torch.equal(guide[0], torch.tensor([14.0, 15.0])) and w[0] == 1.0 and w[3] == 0.0  # row 7 runs at tick 8
    with pytest.raises(ValueError, match="shape"):
        c.accept(torch.zeros(3, 2), 0.8)


def test_after_a_reset_the_next_chunk_starts_afresh():
    """A sensor loss stopped the robot: nothing to continue from, no pending request, the clock restarts."""
    c = ActionChunker(10, 2, RATE)
    c.begin_request(0.0)
    c.accept(torch.ones(10, 2), 0.2)
    guide, weights = c.begin_request(0.8)
    assert weights.sum() > 0  # a guide from the running chunk
    c.reset()
    assert c.pending is None and c.chunk is None and c.needs_request(5.0)
    guide, weights = c.begin_request(5.0)
    assert weights.sum() == 0 and guide.abs().sum() == 0 and c.tick_at(5.0) == 0
