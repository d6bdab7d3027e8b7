"""mstar.engine.device_round: the device thread steps the most urgent due work first, and a control
call that arrives during a batch step runs before that batch engine's next step."""

from __future__ import annotations

from mstar.engine.device_round import engine_class, engine_classes, engines_to_step, next_of_class, step_round
from mstar.priority import Priority
from support.fake_steppables import FakeEngine, FakeGroup

C, IA, B = Priority.CONTROL, Priority.INTERACTIVE, Priority.BATCH


def rounds(loops, n: int) -> None:
    for _ in range(n):
        step_round(loops, lambda: None)


def test_the_control_loop_steps_before_a_batch_loop_listed_first():
    log: list[str] = []
    image = FakeEngine("image", [B, B, B], log)
    policy = FakeEngine("policy", [C, C], log)
    rounds([FakeGroup(image), FakeGroup(policy)], 4)
    assert log == ["policy:control", "policy:control", "image:batch", "image:batch"]


def test_a_control_call_arriving_during_a_batch_step_runs_before_the_next_batch_step():
    log: list[str] = []
    image = FakeEngine("image", [B, B, B], log)
    voice = FakeEngine("voice", [B], log)  # another batch loop after it in the same round
    policy = FakeEngine("policy", [], log)
    image.on_step = lambda: (policy.work.append(C), setattr(image, "on_step", None))
    rounds([FakeGroup(image), FakeGroup(voice), FakeGroup(policy)], 2)
    # the round that stepped the image ends there: the control step comes before any other batch step
    assert log == ["image:batch", "policy:control"]


def test_within_one_worker_engines_step_most_urgent_first_and_less_urgent_wait():
    log: list[str] = []
    image, voice, policy = FakeEngine("image", [B], log), FakeEngine("voice", [IA], log), FakeEngine("policy", [C], log)
    assert engines_to_step([image, voice, policy], None) == [policy, voice, image]
    assert engines_to_step([image, voice, policy], C) == [policy]


def test_work_waiting_to_be_batched_does_not_delay_a_more_urgent_loop():
    log: list[str] = []
    codec = FakeEngine("codec", [], log)
    codec.pending_only = [B]
    policy = FakeEngine("policy", [C], log)
    rounds([FakeGroup(codec), FakeGroup(policy)], 2)
    assert log == ["policy:control", "codec:batched"]


def test_without_classes_every_due_loop_steps_each_round_in_order():
    log: list[str] = []
    image = FakeEngine("image", [B, B], log, classes=False)
    policy = FakeEngine("policy", [C, C], log, classes=False)
    rounds([FakeGroup(image), FakeGroup(policy)], 2)
    assert log == ["image:batch", "policy:control", "image:batch", "policy:control"]


class TwoLoopEngine(FakeEngine):
    """An AR engine whose loops have due work of several classes: it reports each (``due_classes``)."""

    def due_classes(self) -> set[Priority]:
        return set(self.work)

    def step(self, limit: Priority | None = None) -> None:
        self.log.append(f"{self.name}:{limit}")


def test_a_batch_loop_behind_an_interactive_one_of_the_same_engine_is_seen_as_skipped():
    log: list[str] = []
    engine = TwoLoopEngine("bagel", [Priority.INTERACTIVE, Priority.BATCH], log)
    assert engine_classes(engine) == {Priority.INTERACTIVE, Priority.BATCH}
    assert engine_class(engine) == Priority.INTERACTIVE
    assert next_of_class([engine], Priority.BATCH, 0) == 0  # the guard can give the flow its step
    plain = FakeEngine("voice", [Priority.INTERACTIVE], log)
    assert engine_classes(plain) == {Priority.INTERACTIVE} and next_of_class([plain], Priority.BATCH, 0) is None
