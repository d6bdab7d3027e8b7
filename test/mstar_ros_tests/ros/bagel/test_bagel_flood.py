"""A flood of questions, instructions and camera frames reaching a BAGEL node (its callbacks called as the
executor calls them; a runtime that answers only when the test lets it): the node holds at most ``max_pending``
requests of each kind and one frame, converts a frame's pixels once, counts and logs what it refuses, answers
questions while edits are stuck, and unsubscribes a camera flooding bad frames."""

from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest

from mstar.sampling_params import SamplingParams


class _Runtime:
    """A model and a conductor whose requests wait until the test releases them."""

    text_output = "text_ids"
    default_sampling = SamplingParams(temperature=0.0, max_tokens=4)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.asked, self.edited = [], []
        self.release_asks, self.release_edits = asyncio.Event(), asyncio.Event()

    def request(self, text, *, images, sampling, outputs, request_id):
        self.asked.append((text, images[0]))
        return request_id

    def submit(self, request):
        async def items():
            await self.release_asks.wait()
            yield types.SimpleNamespace(name="text_ids", data=7)

        return items()

    def decode_text(self, ids):
        return f"answer {ids}"

    def image_size(self, size, inputs):
        return inputs[0]

    async def generate_images(self, conductor, *, prompt, images, **_):
        self.edited.append((prompt, images[0]))
        await self.release_edits.wait()
        yield types.SimpleNamespace(kind="final", image=np.zeros((8, 8, 3), np.uint8))


def _image(width=32, height=16, encoding="rgb8"):
    from sensor_msgs.msg import Image

    msg = Image(encoding=encoding, width=width, height=height, step=width * 3)
    msg.data = bytes(width * height * 3)
    return msg


def _on_loop(loop, fn):
    """Runs ``fn`` on the loop and waits for it (everything the loop was given before runs first)."""
    return asyncio.run_coroutine_threadsafe(_call(fn), loop).result(10)


async def _call(fn):
    await asyncio.sleep(0.01)  # the tasks started by call_soon_threadsafe get their turn
    return fn()


@pytest.fixture
def node(ros_env):
    import rclpy

    from mstar_ros.ros.bagel.bagel_node import BagelNode

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    rclpy.init(args=["--ros-args", "-p", "max_pending:=2", "-p", "max_frame_age_s:=0.0"])
    runtime = _Runtime(loop)
    made = BagelNode(runtime, runtime, loop, "/robot1")
    try:
        yield made, runtime
    finally:
        made.closing = True
        asyncio.run_coroutine_threadsafe(_call(made.close), loop).result(10)
        made.destroy_node()
        rclpy.shutdown()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_flood_holds_two_requests_a_kind_and_one_frame_and_questions_are_answered_while_edits_wait(node):
    from std_msgs.msg import String

    bagel, runtime = node
    for _ in range(50):  # frames replace each other: one is held, none converted yet
        bagel._on_camera(_image())
    newest = _image()
    bagel._on_camera(newest)
    assert bagel.frame.held()[0] is newest and bagel.frame.conversions == 0
    for i in range(300):
        bagel._on_question(String(data=f"what is on the table? {i}"))
        bagel._on_edit(String(data=f"the cup in the drawer {i}"))
    assert (bagel.slots.taken("ask"), bagel.slots.taken("edit")) == (2, 2)
    assert bagel.frame.conversions == 1  # four requests, one frame: converted once, shared
    s = bagel.stats
    assert (s.busy, s.dropped) == (596, 596)
    assert s.dropped_by_topic == {"/robot1/bagel/question": 298, "/robot1/bagel/edit": 298}
    assert s.last_error == "/robot1/bagel/edit: busy, 2 instructions not done yet (max_pending 2)"

    _on_loop(runtime.loop, lambda: None)
    assert len(runtime.asked) == 2 and len(runtime.edited) == 2
    assert runtime.asked[0][1] is runtime.asked[1][1] is runtime.edited[0][1]  # one array, shared
    assert not runtime.asked[0][1].flags.writeable

    runtime.loop.call_soon_threadsafe(runtime.release_asks.set)  # the edits stay stuck
    _on_loop(runtime.loop, lambda: None)
    assert (s.answers, bagel.slots.taken("ask"), bagel.slots.taken("edit")) == (2, 0, 2)
    bagel._on_question(String(data="and now?"))  # a question gets a slot while edits still hold theirs
    bagel._on_edit(String(data="still busy"))
    _on_loop(runtime.loop, lambda: None)
    assert s.answers == 3 and runtime.asked[-1][0] == "and now?" and s.busy == 597
    assert bagel.pending == 2  # the two stuck edits


def test_a_camera_flooding_bad_frames_is_unsubscribed_and_counted(node):
    bagel, _ = node
    camera = bagel.params.camera_topic
    for _ in range(200):  # 200 frames in far less than a quarter second, all of an unsupported encoding
        bagel._on_camera(_image(encoding="16UC1"))
    # shut once, after a quarter second's worth at max_bad_rate_hz 100; the frames called in after it stand
    # for those already in flight: counted, not tripping it again
    assert bagel.stats.topics_shut == 1 and not bagel.sensors.is_open(camera)
    assert bagel.stats.dropped == 200
    assert bagel.stats.frames == 0 and bagel.frame.held() is None
