"""mstar.engine.step_trace: the device thread's record of engine steps (off unless set), and how a window's
time splits between the classes and engines that stepped inside it."""

from __future__ import annotations

import time

from mstar.engine.device_loop import DeviceLoop, device_thread
from mstar.engine.step_trace import StepRecord, StepTrace
from mstar.priority import Priority
from support.fake_steppables import FakeEngine

CONTROL, BATCH = Priority.CONTROL, Priority.BATCH


def test_a_window_splits_into_the_steps_inside_it_and_idle():
    trace = StepTrace()
    trace.records.extend(
        [
            StepRecord(0.0, 1.0, "w", "ar:pi05", CONTROL),
            StepRecord(1.5, 3.0, "w", "ar:bagel", BATCH),
            StepRecord(5.0, 6.0, "w", "ar:bagel", BATCH),  # outside the window
        ]
    )
    assert trace.overlap(0.5, 2.5) == {"control": 0.5, "batch": 1.0, "idle": 0.5}
    assert trace.overlap(0.5, 2.5, by="engine") == {"ar:pi05": 0.5, "ar:bagel": 1.0, "idle": 0.5}
    assert trace.overlap(3.5, 4.5) == {"idle": 1.0}


def test_the_device_thread_records_each_engine_step_with_its_class_when_asked():
    log: list[str] = []
    policy, images = FakeEngine("ar:pi05", [CONTROL, CONTROL], log), FakeEngine("ar:bagel", [BATCH], log)
    device = device_thread()
    device.trace = trace = StepTrace()
    loop = DeviceLoop([images, policy], name="worker0")
    try:
        loop.start()
        deadline = time.monotonic() + 10
        while (policy.work or images.work) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
        device.trace = None
    steps = [(r.engine, r.cls, r.loop) for r in trace.records]
    assert steps == [("ar:pi05", CONTROL, "worker0")] * 2 + [("ar:bagel", BATCH, "worker0")]
    assert all(r.start <= r.end for r in trace.records)
