"""mstar.engine.starvation: skipped due work takes one step after its wait, never more than its share of
the device, and a control call still waits at most one step of lower-class work. Fake engines on a fake
clock (support.fake_steppables): each step costs whole units of time."""

from __future__ import annotations

from mstar.engine.device_round import next_of_class, step_round
from mstar.engine.starvation import StarvationGuard, StarvationLimit
from mstar.priority import Priority
from support.fake_steppables import FakeClock, FakeEngine, FakeGroup

C, IA, B = Priority.CONTROL, Priority.INTERACTIVE, Priority.BATCH


def run(loops, guard: StarvationGuard | None, n: int) -> None:
    for _ in range(n):
        step_round(loops, lambda: None, guard)


def gaps(log: list[str], name: str) -> list[int]:
    """Steps of others before each of ``name``'s steps."""
    out, count = [], 0
    for entry in log:
        if entry.startswith(name + ":"):
            out.append(count)
            count = 0
        else:
            count += 1
    return out


def busy_voice_and_images(wait_s: float, share: float, image_cost: float = 1.0, voice_steps: int = 60):
    log: list[str] = []
    clock = FakeClock()
    voice = FakeEngine("voice", [IA] * voice_steps, log, clock=clock, cost_s=1.0)
    image = FakeEngine("image", [B] * 20, log, clock=clock, cost_s=image_cost)
    limit = StarvationLimit.of(wait_s * 1000, share)
    return log, clock, voice, image, [FakeGroup(image, starvation=limit), FakeGroup(voice)]


def test_skipped_batch_work_takes_one_step_each_time_it_has_waited_its_limit():
    log, clock, _voice, _image, loops = busy_voice_and_images(wait_s=5.0, share=0.5)
    run(loops, StarvationGuard(clock), 40)
    assert gaps(log, "image")[:5] == [5, 5, 5, 5, 5]


def test_strict_priority_without_a_limit_leaves_batch_waiting_while_voice_is_due():
    log, clock, _voice, _image, loops = busy_voice_and_images(wait_s=0.0, share=0.5, voice_steps=30)
    assert loops[0].starvation is None
    run(loops, StarvationGuard(clock), 32)
    assert log[:30] == ["voice:interactive"] * 30 and log[30:] == ["image:batch"] * 2


def test_long_skipped_steps_get_at_most_their_share_of_the_device():
    log, clock, _voice, _image, loops = busy_voice_and_images(wait_s=1.0, share=0.2, image_cost=10.0, voice_steps=200)
    run(loops, StarvationGuard(clock), 200)
    images = log.count("image:batch")
    assert images >= 3
    assert images * 10.0 / clock.now <= 0.2 + 10.0 / clock.now  # 0.2 of the time, give or take the last step
    assert gaps(log, "image")[1:3] == [40, 40]  # a 10-unit step, then 10 * (1 / 0.2 - 1) units of waiting


def test_a_control_call_arriving_during_a_voice_step_goes_before_an_overdue_batch_step():
    log, clock, voice, _image, loops = busy_voice_and_images(wait_s=5.0, share=0.5)
    policy = FakeEngine("policy", [], log, clock=clock, cost_s=1.0)
    loops.append(FakeGroup(policy))
    voice.on_step = lambda: policy.work.append(C) if clock.now == 5.0 else None  # batch is overdue from t=5
    run(loops, StarvationGuard(clock), 8)
    assert log[:7] == ["voice:interactive"] * 5 + ["policy:control", "image:batch"]


def test_a_control_call_arriving_during_a_skipped_batch_step_goes_next():
    log, clock, _voice, image, loops = busy_voice_and_images(wait_s=5.0, share=0.5)
    policy = FakeEngine("policy", [], log, clock=clock, cost_s=1.0)
    loops.append(FakeGroup(policy))
    image.on_step = lambda: (policy.work.append(C), setattr(image, "on_step", None))
    run(loops, StarvationGuard(clock), 7)
    assert log[:8] == ["voice:interactive"] * 5 + ["image:batch", "policy:control", "voice:interactive"]


def test_engines_of_one_class_take_skipped_steps_in_turn():
    log: list[str] = []
    a, b, voice = FakeEngine("a", [B, B], log), FakeEngine("b", [B], log), FakeEngine("v", [IA], log)
    engines = [a, voice, b]
    assert [next_of_class(engines, B, start) for start in range(4)] == [0, 2, 2, 0]
    assert next_of_class(engines, C, 0) is None


def test_an_engine_config_gives_the_limit_and_zero_is_strict():
    from mstar.engine.config import EngineConfig

    assert EngineConfig().starvation() == StarvationLimit(wait_s=0.2, share=0.05)
    assert EngineConfig(starvation_wait_ms=0).starvation() is None
    assert EngineConfig(starvation_wait_ms=None).starvation() is None
    assert EngineConfig(starved_share=0).starvation() is None
