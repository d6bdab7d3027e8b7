"""A toy model with the gateway's image capability (mstar_ros.webrtc.image_models) and text answers, on a
real tiny Walk Graph served by a real Conductor: what the images API, chat and ``mstar-ros bagel`` tests drive.

Walk ``draw``: a Conductor-driven Loop of ``steps`` flow steps of a stateless ``flow`` node, each moving
the image from its seeded noise a step closer to its target (a gradient set by the prompt's length, or
255 minus the input image for an edit); each step's image streams out on ``image``. Walk ``say``: a
Loop that streams an answer's bytes one a step on ``text_ids`` (the answer says the image's size and the
question). Everything is deterministic: the same prompt, size, seed and steps give the same images.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import torch

from mstar.conductor import Request
from mstar.graph import DynamicLoop, GraphEdge, GraphNode, ModelGraph, NodeSubmodule
from mstar.sampling_params import SamplingParams
from mstar_ros.webrtc.image_models import ImageEvent

STEP = 8  # the toy's "VAE" takes sizes in multiples of 8
MIN_SIDE, MAX_SIDE = 8, 256


class FlowStep(NodeSubmodule):
    """x -> x + (target - x) / (steps - t): after ``steps`` steps x is the target; ``delay`` s per batch."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay

    def forward(self, x, target, t, steps):
        if self.delay:
            time.sleep(self.delay)
        left = (steps - t).clamp(min=1).float().reshape(-1, 1, 1, 1)
        return {"x": x + (target - x) / left, "t": t + 1}


class SayByte(NodeSubmodule):
    """The answer's ``t``-th byte, one a step."""

    def forward(self, answer, t):
        picked = answer.gather(1, t.reshape(-1, 1).clamp(max=answer.shape[1] - 1)).reshape(-1)
        return {"token": picked, "t": t + 1}


def toy_image_graph() -> ModelGraph:
    def next_walk(state):
        return None if state.last_walk else state.request.meta["walk"]

    return ModelGraph(
        name="toy_image",
        nodes=[
            GraphNode("flow", inputs=["x", "target", "t", "steps"], outputs=["x", "t"]),
            GraphNode("say", inputs=["answer", "t"], outputs=["token", "t"]),
        ],
        edges=[
            GraphEdge("input.noise", "flow.x"),
            GraphEdge("input.target", "flow.target"),
            GraphEdge("input.start", "flow.t"),
            GraphEdge("input.steps", "flow.steps"),
            GraphEdge("flow.x", "flow.x"),
            GraphEdge("flow.t", "flow.t"),
            GraphEdge("flow.x", "output.image"),
            GraphEdge("input.answer", "say.answer"),
            GraphEdge("input.start", "say.t"),
            GraphEdge("say.t", "say.t"),
            GraphEdge("say.token", "output.text_ids"),
        ],
        walks={
            "draw": DynamicLoop("flow", trip_count=lambda s: int(s.request.meta["steps"])),
            "say": DynamicLoop("say", trip_count=lambda s: int(s.request.meta["say"])),
        },
        next_walk=next_walk,
        required_inputs=["start"],
    )


def target_image(prompt: str, size: tuple[int, int], source: np.ndarray | None = None) -> np.ndarray:
    """What the toy draws: a gradient set by the prompt's length, or the negative of ``source`` (resized)."""
    width, height = size
    if source is not None:
        rows = np.arange(height) * source.shape[0] // height
        cols = np.arange(width) * source.shape[1] // width
        return (255 - source[rows][:, cols]).astype(np.float32)
    y, x = np.mgrid[0:height, 0:width]
    k = len(prompt)
    rgb = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), np.full_like(x, k * 7 % 256)], -1)
    return rgb.astype(np.float32)


class ToyImageModel:
    """Generations, edits (up to two input images, no mask), and text answers about an image."""

    image_generation = True
    image_edit = True
    image_mask = False
    max_images_per_request = 4
    max_input_images = 2
    default_image_steps = 4
    conversational = True
    image_input = True
    text_output = "text_ids"
    default_sampling = SamplingParams(max_tokens=64)
    random_weights = True

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def graph(self) -> ModelGraph:
        return toy_image_graph()

    def modules(self) -> dict:
        return {"flow": FlowStep(self.delay), "say": SayByte()}

    # -- images --------------------------------------------------------------------------------
    def image_size(self, size: tuple[int, int] | None, inputs: list[tuple[int, int]]) -> tuple[int, int]:
        if size is None:
            if not inputs:
                return 32, 24
            w, h = inputs[0]
            return (min(max(w // STEP * STEP, MIN_SIDE), MAX_SIDE), min(max(h // STEP * STEP, MIN_SIDE), MAX_SIDE))
        w, h = size
        if w % STEP or h % STEP or not (MIN_SIDE <= w <= MAX_SIDE and MIN_SIDE <= h <= MAX_SIDE):
            raise ValueError(
                f"size {w}x{h}: width and height must be multiples of {STEP} from {MIN_SIDE} to {MAX_SIDE}"
            )
        return w, h

    def _draw_request(self, prompt, source, size, seed, steps, request_id) -> Request:
        width, height = size
        g = torch.Generator().manual_seed(seed)
        noise = torch.rand(height, width, 3, generator=g) * 255
        target = torch.from_numpy(target_image(prompt, size, source))
        return Request(
            {"noise": noise, "target": target, "start": torch.tensor(0), "steps": torch.tensor(steps)},
            request_id=request_id,
            meta={"walk": "draw", "steps": steps},
            outputs=frozenset({"image"}),
        )

    async def generate_images(
        self,
        conductor,
        *,
        prompt: str,
        images: list[np.ndarray],
        size: tuple[int, int],
        n: int,
        seed: int | None,
        steps: int | None,
        partial_images: int,
        request_id: str,
    ) -> AsyncIterator[ImageEvent]:
        if prompt.strip().lower() == "refuse":  # how a test sees a model's refusal become a 400
            raise ValueError("the toy refuses this prompt")
        steps = steps or self.default_image_steps
        base = seed if seed is not None else int(time.time_ns() % 2**31)
        source = images[0] if images else None
        # the steps after which a preview goes out: spread over the flow, never the last one
        previews = sorted({steps * (j + 1) // (partial_images + 1) for j in range(partial_images)} - {0, steps})
        queue: asyncio.Queue = asyncio.Queue()
        ids = [f"{request_id}-{i}" for i in range(n)]

        async def pump(i: int) -> None:
            try:
                request = self._draw_request(prompt, source, size, base + i, steps, ids[i])
                async for out in conductor.submit(request):
                    await queue.put((i, out.index + 1, out.data))
                await queue.put((i, None, None))
            except Exception as exc:
                await queue.put((i, exc, None))

        tasks = [asyncio.ensure_future(pump(i)) for i in range(n)]
        try:
            done, partial_of = 0, [0] * n
            while done < n:
                i, step, data = await queue.get()
                if isinstance(step, Exception):
                    raise step
                if step is None:
                    done += 1
                    continue
                image = data.clamp(0, 255).round().to(torch.uint8).numpy()
                yield ImageEvent("progress", i, step=step, steps=steps)
                if step == steps:
                    yield ImageEvent(
                        "final", i, image, step=step, steps=steps, input_tokens=len(prompt) if i == 0 else 0
                    )
                elif step in previews and partial_of[i] < partial_images:
                    yield ImageEvent("partial", i, image, partial_index=partial_of[i], step=step, steps=steps)
                    partial_of[i] += 1
        finally:
            for task in tasks:
                task.cancel()
            for rid in ids:
                with contextlib.suppress(Exception):
                    await conductor.cancel(rid)

    # -- text ----------------------------------------------------------------------------------
    def decode_text(self, ids: list[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def request(
        self,
        text: str | None = None,
        *,
        audio=None,
        images=(),
        history=(),
        voice=None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
        speak: bool = False,
    ) -> Request:
        if speak or audio is not None:
            raise ValueError("the toy answers in text and hears nothing")
        sizes = [(im.shape[1], im.shape[0]) if isinstance(im, np.ndarray) else im.size for im in images]
        seen = ", ".join(f"{w}x{h}" for w, h in sizes) or "no"
        answer = f"I see {seen} image(s). You asked: {text or ''}".encode()
        cap = (sampling or self.default_sampling).max_tokens
        said = answer[:cap]
        extra = {"request_id": request_id} if request_id else {}
        return Request(
            {"answer": torch.tensor(list(said), dtype=torch.long), "start": torch.tensor(0)},
            sampling=sampling or self.default_sampling,
            meta={"walk": "say", "say": len(said)},
            outputs=frozenset({"text_ids"}),
            **extra,
        )
