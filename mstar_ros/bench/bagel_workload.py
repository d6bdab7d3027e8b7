"""The BAGEL bench's inputs: synthetic pictures, prompts, and each task's request for both systems.

One :class:`ImageJob` / :class:`ChatJob` holds the served path's Request and what the baseline takes
from the same request (its prepared image tensors, noise and settings), so both systems see identical
inputs. Edit settings are app.py's edit ones (image scale 2, interval (0, 1], text_channel renorm);
text-to-image the inferencer's defaults (text 4, image 1.5, interval (0.4, 1], global renorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from mstar.request import Request
from mstar_graphs.bagel.guidance import GuidanceParams

EDIT_PROMPT = "Change the color of the car to blue and add snow on the road."
T2I_PROMPT = "A photo of a mountain lake at sunrise, with pine trees and a wooden boat."
QUESTIONS = [
    "Describe this image in detail.",
    "What is in the picture?",
    "What color is the car in this photo?",
    "How many trees are next to the lake?",
]


def picture(side: int, index: int = 0) -> Image.Image:
    """A deterministic side x side RGB picture (stripes and a gradient; ``index`` varies the pattern)."""
    y, x = np.mgrid[0:side, 0:side]
    a, b = 3 + index, 5 + 2 * index
    rgb = np.stack([(x * a) % 256, (y * b) % 256, ((x + y) * (index + 1) + 40 * index) % 256], -1)
    return Image.fromarray(rgb.astype(np.uint8))


@dataclass
class ImageJob:
    request: Request
    turn: list[int]  # the prompt's text turn (the baseline appends it)

    @property
    def noise(self) -> torch.Tensor:
        return self.request.inputs["noise"]

    @property
    def gen_params(self) -> torch.Tensor:
        return self.request.inputs["gen_params"]

    @property
    def full_context_rows(self) -> int:
        """Rows of the full context: an edit whose full view forks the no-text one (request meta
        ``llm.kv_from``) brings only its instruction's rows, the rest is the no-text context's."""
        inputs = self.request.inputs
        rows = int(inputs["ids"].numel())
        if self.request.meta.get("llm.kv_from") == "llm_cfg_text":
            rows += int(inputs["cfg_text_ids"].numel())
        return rows


@dataclass
class ChatJob:
    request: Request
    turn: list[int]
    max_tokens: int

    @property
    def vit_image(self) -> torch.Tensor:
        return self.request.inputs["vit_image"]


def edit_job(bagel, side: int, steps: int, seed: int, request_id: str) -> ImageJob:
    guidance = GuidanceParams(steps=steps, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")
    request = bagel.requests.edit(picture(side), EDIT_PROMPT, guidance=guidance, seed=seed, request_id=request_id)
    return ImageJob(request, bagel.tokenizer.text_turn(EDIT_PROMPT))


def t2i_job(bagel, side: int, steps: int, seed: int, request_id: str) -> ImageJob:
    request = bagel.requests.generate(
        T2I_PROMPT, size=(side, side), guidance=GuidanceParams(steps=steps), seed=seed, request_id=request_id
    )
    return ImageJob(request, bagel.tokenizer.text_turn(T2I_PROMPT))


def chat_job(bagel, side: int, index: int, max_tokens: int, request_id: str) -> ChatJob:
    question = QUESTIONS[index % len(QUESTIONS)]
    request = bagel.requests.understand(picture(side, index), question, max_tokens=max_tokens, request_id=request_id)
    return ChatJob(request, bagel.tokenizer.text_turn(question), max_tokens)
