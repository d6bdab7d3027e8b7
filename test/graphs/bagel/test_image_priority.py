"""BAGEL's image requests are batch unless ``generate_images(priority=...)`` says otherwise (a robot waiting
for a goal image). A stand-in Conductor records what is submitted: no model runs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mstar.priority import Priority
from mstar_graphs.bagel.frontend import BagelModel


class RecordingConductor:
    def __init__(self) -> None:
        self.classes: list[Priority] = []

    def submit(self, request):
        self.classes.append(request.priority)

        async def nothing():
            return
            yield

        return nothing()

    async def cancel(self, request_id: str) -> None:
        pass


def submitted_classes(bagel: BagelModel, images: list, **kwargs) -> list[Priority]:
    conductor = RecordingConductor()

    async def main() -> None:
        events = bagel.generate_images(
            conductor, prompt="a cup", images=images, size=(32, 32), n=2, seed=0, steps=2, request_id="i", **kwargs
        )
        with pytest.raises(RuntimeError, match="ended without an image"):  # the stand-in makes none
            async for _event in events:
                pass

    asyncio.run(main())
    return conductor.classes


@pytest.fixture(scope="module")
def bagel(ckpt) -> BagelModel:
    return BagelModel.load(ckpt, requests_only=True)


def test_images_and_edits_are_batch_unless_a_class_is_given(bagel):
    frame = np.zeros((32, 32, 3), dtype=np.uint8)
    assert set(submitted_classes(bagel, [])) == {Priority.BATCH}
    assert set(submitted_classes(bagel, [frame], priority="control")) == {Priority.CONTROL}
    with pytest.raises(ValueError, match="not a priority class"):
        submitted_classes(bagel, [], priority="urgent")
