"""V-JEPA 2-AC rollouts as frame Loops over a persistent KV: equal to Meta's native recompute at
every step, each frame computed once, the window kept exactly, samples sharing blocks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar.engine.ar_engine import AREngine
from mstar.engine.messages import ExecuteNode, LoopSpec
from mstar.graph import LoopMode
from mstar.request import Request, RequestError
from mstar.transport.inprocess import InProcessTensorStore
from mstar_graphs.vjepa2.frontend import encode_request, observe_request, rollout_request
from mstar_graphs.vjepa2.graph import vjepa2_graph
from mstar_graphs.vjepa2.planner import CemEnergy, CemRefit, CemSample
from mstar_graphs.vjepa2.reference import native_rollout as reference_rollout
from support.parity import FP32, fp32

F_CTX, H = 4, 6


def _modules(encoder, predictor):
    return {
        "encoder": encoder,
        "predictor": predictor,
        "cem_sample": CemSample(),
        "cem_energy": CemEnergy(),
        "cem_refit": CemRefit(),
    }


def _episode(seed: int, frames: int, size: int = 32):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (frames, size, size, 3), generator=g, dtype=torch.uint8)
    states = torch.rand(frames, 7, generator=g) * 0.2
    actions = torch.randn(frames, 7, generator=g) * 0.05
    return images, states, actions


def native_rollout(predictor, latents, actions, states, start_state, rollout_actions):
    """Meta's rollout (the whole context re-run every step) for one action sequence."""
    all_states = torch.stack(list(states) + [start_state])
    return list(reference_rollout(predictor, latents, actions, all_states, rollout_actions[None])[0])


def _run(coro):
    return asyncio.run(coro)


def test_rollout_with_persistent_kv_equals_native_recompute_at_every_step(vj_encoder, vj_predictor):
    images, states, actions = _episode(0, F_CTX)
    g = torch.Generator().manual_seed(1)
    roll = torch.randn(2, H, 7, generator=g) * 0.05

    async def main():
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            latents = (await c.submit(encode_request(images)).collect())["latents"][0]
            await c.submit(observe_request(images, states, actions, session_id="s")).collect()
            used = c.kv_blocks_used()
            out = await c.submit(rollout_request(roll, session_id="s", all_frames=True)).collect()
            stats = c.engine_stats() if hasattr(c, "engine_stats") else None
            return latents, used, out, stats

    latents, used, out, _ = _run(main())
    assert used == F_CTX - 1  # one block per computed frame; the newest waits for its action
    frames = out["frames"][0]
    assert frames.shape == (2, H, 16, 64)
    assert torch.equal(out["frame"][0], frames[:, -1])
    for s in range(2):
        # context frame i carries the action taken at it: actions[i + 1] (from consecutive poses)
        want = native_rollout(
            vj_predictor, latents[:F_CTX], actions[1:F_CTX], list(states[: F_CTX - 1]), states[F_CTX - 1], roll[s]
        )
        for h in range(H):
            err = float((frames[s, h] - want[h]).abs().max())
            assert err < 1e-4, f"sample {s} step {h}: {err}"
    assert float((frames[0] - frames[1]).abs().max()) > 1e-3  # the actions matter


def test_each_frame_is_computed_once_and_the_window_slides_exactly(vj_encoder, vj_predictor):
    window = 4
    images, states, actions = _episode(2, 6)
    roll = torch.randn(1, 1, 7, generator=torch.Generator().manual_seed(3)) * 0.05

    async def main():
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            engine = c.workers[0].ar_engines["predictor"]
            seen = []
            for i in range(6):
                await c.submit(
                    Request(
                        {"frames": images[i : i + 1], "states": states[i : i + 1], "actions": actions[i : i + 1]},
                        session_id="s",
                        meta={"context.kv_window": window},
                    )
                ).collect()
                seen.append((c.kv_blocks_used(), engine.loops[LoopMode.FRAMES].frames_computed))
            out = await c.submit(Request({"actions": roll}, session_id="s")).collect()
            latents = (await c.submit(Request({"frames": images}, meta={"walk": "encode"})).collect())["latents"][0]
            slides = engine.loops[LoopMode.FRAMES].stats()["window_slides"]
            c.close_session("s")
            for _ in range(200):
                if c.kv_blocks_used() == 0:
                    break
                await asyncio.sleep(0.01)
            return seen, out["frame"][0][0], latents, slides, c.kv_blocks_used()

    seen, pred, latents, slides, after_close = _run(main())
    blocks = [b for b, _ in seen]
    assert blocks == [0, 1, 2, 3, 1, 2]  # bounded by the window (the pending frame is not in the KV)
    assert [n for _, n in seen] == [0, 1, 2, 3, 4, 5]  # 1 frame per message; the slide recomputes 1 kept frame
    assert slides == 1 and after_close == 0
    # after the slide the context holds frames 3, 4 (positions 0, 1), frame 5 pending
    want = native_rollout(vj_predictor, latents[3:6], actions[4:6], list(states[3:5]), states[5], roll[0])[0]
    assert float((pred - want).abs().max()) < 1e-4
    unslid = native_rollout(vj_predictor, latents[:6], actions[1:6], list(states[:5]), states[5], roll[0])[0]
    assert float((pred - unslid).abs().max()) > 1e-4  # positions and dropped frames matter


def test_plan_samples_share_exactly_the_blocks_before_their_first_action(vj_predictor):
    store = InProcessTensorStore()
    engine = AREngine(vj_predictor, ["context", "rollout"], store, fp32())
    replies = []
    latents = torch.randn(3, 16, 64)
    put = lambda t: store.put(t, owner="r")  # noqa: E731
    engine._handle(
        ExecuteNode(
            1,
            "r",
            "context",
            {"latents": put(latents), "states": put(torch.rand(3, 7)), "actions": put(torch.randn(3, 7) * 0.05)},
            session_id="s",
            loop_mode=LoopMode.FRAMES,
        ),
        replies.append,
    )
    engine.step()
    ctx = engine.loops[LoopMode.FRAMES].context("s", "context")
    assert replies[-1].error is None and len(ctx.table.blocks) == 2
    engine._handle(
        ExecuteNode(
            2,
            "r",
            "rollout",
            {"actions": put(torch.randn(5, 3, 7) * 0.05)},
            session_id="s",
            kv_from="context",
            loop_mode=LoopMode.FRAMES,
            loop=LoopSpec(max_iters=3),
        ),
        replies.append,
    )
    engine.step()
    rollout = engine.loops[LoopMode.FRAMES].rollouts[("s", "rollout")]
    shared = ctx.table.blocks
    for table in rollout.tables:
        assert table.blocks[:2] == shared  # the frames before the first action: shared
        assert len(table.blocks) == 2 + 3  # from the frame carrying the first action on: its own,
    own = [b for t in rollout.tables for b in t.blocks[2:]]  # reserved for the whole horizon when it forked
    assert len(set(own)) == 5 * 3 and not set(own) & set(shared)
    assert all(engine.blocks.ref_count(b) == 6 for b in shared)  # the context + 5 samples
    engine.step()
    engine.step()
    assert replies[-1].final and replies[-1].error is None and "frame" in replies[-1].outputs
    assert engine.blocks.num_used_blocks == 2 and all(engine.blocks.ref_count(b) == 1 for b in shared)


def test_bad_input_is_reported_and_the_session_keeps_serving(vj_encoder, vj_predictor):
    images, states, actions = _episode(4, 3)
    roll = torch.randn(1, 2, 7) * 0.05

    async def main():
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            errors = []
            for req in [
                Request({"actions": roll}, session_id="s"),  # before any frame
                Request(
                    {"frames": images, "states": states.clone().fill_(float("nan")), "actions": actions}, session_id="s"
                ),
                Request({"frames": images, "states": states[:, :5], "actions": actions}, session_id="s"),
                Request({"frames": images[..., :2], "states": states, "actions": actions}, session_id="s"),
            ]:
                with pytest.raises(RequestError) as info:
                    await c.submit(req).collect()
                errors.append(str(info.value))
            await c.submit(Request({"frames": images, "states": states, "actions": actions}, session_id="s")).collect()
            out = await c.submit(Request({"actions": roll}, session_id="s")).collect()
            return errors, out

    errors, out = _run(main())
    assert "no frame to roll out from" in errors[0]
    assert "NaN" in errors[1]
    assert "'states' has shape (3, 5)" in errors[2]
    assert "[H, W, 3]" in errors[3]
    assert out["frame"][0].shape == (1, 16, 64) and torch.isfinite(out["frame"][0]).all()


def test_rollout_longer_than_the_frame_capacity_is_refused(vj_encoder, vj_predictor):
    images, states, actions = _episode(5, 2)
    roll = torch.zeros(1, vj_predictor.max_frames, 7)

    async def main():
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            await c.submit(Request({"frames": images, "states": states, "actions": actions}, session_id="s")).collect()
            with pytest.raises(RequestError, match="frame positions"):
                await c.submit(Request({"actions": roll}, session_id="s")).collect()
            await asyncio.sleep(0.05)
            return c.kv_blocks_used()

    assert _run(main()) == 1


def test_a_rollout_the_pool_cannot_hold_fails_at_once_and_two_that_fit_one_by_one_both_finish(vj_predictor):
    """Every frame a rollout computes is reserved when it forks: no rollout waits forever on blocks
    another holds (two rollouts that each took their first frames could otherwise deadlock)."""
    store = InProcessTensorStore()
    engine = AREngine(vj_predictor, ["context", "rollout"], store, fp32(num_kv_blocks=10))
    put = lambda t: store.put(t, owner="r")  # noqa: E731
    replies: dict[int, list] = {}
    for i, session in enumerate(("s1", "s2")):
        engine._handle(
            ExecuteNode(
                i,
                "r",
                "context",
                {
                    "latents": put(torch.randn(2, 16, 64)),
                    "states": put(torch.rand(2, 7)),
                    "actions": put(torch.zeros(2, 7)),
                },
                session_id=session,
                loop_mode=LoopMode.FRAMES,
            ),
            replies.setdefault(i, []).append,
        )
    engine.step()
    assert engine.blocks.num_used_blocks == 2  # one computed frame per session
    engine._handle(
        ExecuteNode(
            7,
            "r",
            "rollout",
            {"actions": put(torch.zeros(5, 2, 7))},
            session_id="s1",
            kv_from="context",
            loop_mode=LoopMode.FRAMES,
        ),
        replies.setdefault(7, []).append,
    )
    engine.step()
    assert "need 10 KV frame blocks; 8 of 10 are free" in replies[7][-1].error
    for i, session in ((8, "s1"), (9, "s2")):  # 4 x 2 frames each: they fit one after the other
        engine._handle(
            ExecuteNode(
                i,
                "r",
                "rollout",
                {"actions": put(torch.zeros(4, 2, 7))},
                session_id=session,
                kv_from="context",
                loop_mode=LoopMode.FRAMES,
            ),
            replies.setdefault(i, []).append,
        )
    for _ in range(10):
        engine.step()
    assert replies[8][-1].error is None and replies[9][-1].error is None
    assert replies[8][-1].outputs and replies[9][-1].outputs
    assert engine.blocks.num_used_blocks == 2 and not engine.loops[LoopMode.FRAMES].rollouts


def test_a_failing_frame_forward_fails_its_call_and_drops_the_half_written_context(vj_predictor, monkeypatch):
    store = InProcessTensorStore()
    engine = AREngine(vj_predictor, ["context", "rollout"], store, fp32())
    put = lambda t: store.put(t, owner="r")  # noqa: E731

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(vj_predictor, "forward_frames", boom)
    replies: list = []
    engine._handle(
        ExecuteNode(
            1,
            "r",
            "context",
            {
                "latents": put(torch.randn(3, 16, 64)),
                "states": put(torch.rand(3, 7)),
                "actions": put(torch.zeros(3, 7)),
            },
            session_id="s",
            loop_mode=LoopMode.FRAMES,
        ),
        replies.append,
    )
    engine.step()
    assert replies and replies[-1].final and replies[-1].error == "frame step failed: RuntimeError: boom"
    assert engine.loops[LoopMode.FRAMES].context("s", "context") is None and engine.blocks.num_used_blocks == 0
