"""The node set's in-flight limit: how many robots' chunks run at once, and who goes next."""

from __future__ import annotations

import asyncio

import pytest

from mstar_ros.bench.pi05_loads import admitted
from mstar_ros.policy.admission import ChunkAdmission


class Robot:
    def __init__(self, admission: ChunkAdmission, name: str, due: float) -> None:
        self.admission, self.name, self.due, self.woken = admission, name, due, 0

    def wake(self) -> None:
        self.woken += 1

    def ask(self) -> bool:
        return self.admission.try_acquire(self.name, self.due, self.wake)


def test_robots_go_in_the_order_their_chunks_fell_due():
    a = ChunkAdmission(1)
    first, second, third = (Robot(a, n, due) for n, due in (("/r1", 1.0), ("/r2", 2.0), ("/r3", 3.0)))
    assert first.ask() and a.in_flight == 1
    assert not third.ask() and not second.ask()
    a.release()  # the first robot's chunk came back: the slot is for the robot due longest
    assert (second.woken, third.woken) == (1, 0)
    assert not third.ask() and second.ask()
    a.release()
    assert third.woken == 1 and third.ask()


def test_a_freed_slot_is_not_taken_by_a_robot_that_fell_due_later():
    a = ChunkAdmission(2)
    assert Robot(a, "/r1", 0.0).ask()
    early, late = Robot(a, "/r2", 1.0), Robot(a, "/r3", 2.0)
    assert late.ask()  # one slot free, nobody waiting: admitted
    assert not early.ask()  # both slots taken
    a.release()
    assert early.woken == 1
    assert not Robot(a, "/r4", 3.0).ask()  # /r2 waits longer: the free slot is its
    assert early.ask()


def test_every_freed_slot_wakes_a_waiting_robot():
    a = ChunkAdmission(2)
    assert Robot(a, "/r1", 0.0).ask() and Robot(a, "/r2", 0.0).ask()
    waiting = [Robot(a, f"/w{i}", 1.0 + i) for i in range(3)]
    assert not any(r.ask() for r in waiting)
    a.release()
    a.release()  # both slots free before anyone retried: the two longest-waiting are woken
    assert [r.woken > 0 for r in waiting] == [True, True, False]
    assert waiting[0].ask() and waiting[1].ask() and not waiting[2].ask()


def test_a_robot_whose_sensors_went_quiet_stops_holding_the_others_back():
    a = ChunkAdmission(1)
    busy, quiet, other = Robot(a, "/r1", 0.0), Robot(a, "/r2", 1.0), Robot(a, "/r3", 2.0)
    assert busy.ask() and not quiet.ask() and not other.ask()
    a.release()
    assert quiet.woken == 1 and other.woken == 0
    a.withdraw("/r2")  # it was woken but had nothing to send
    assert other.woken == 1 and other.ask()


def test_no_limit_admits_everyone_and_a_negative_limit_is_refused():
    a = ChunkAdmission(0)
    assert all(Robot(a, f"/r{i}", 0.0).ask() for i in range(20))
    with pytest.raises(ValueError, match="max in-flight chunks must be >= 0"):
        ChunkAdmission(-1)


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_the_bench_robots_hold_slots_the_same_way(limit):
    admission, running, peak = ChunkAdmission(limit), [0], [0]

    async def robot(name: str) -> None:
        for _ in range(3):
            async with admitted(admission, name):
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                await asyncio.sleep(0.005)
                running[0] -= 1

    async def main() -> None:
        await asyncio.gather(*(robot(f"/r{i}") for i in range(6)))

    asyncio.run(main())
    assert peak[0] == limit == admission.peak_in_flight and admission.in_flight == 0
