"""The policy node's control loop: when a chunk is due, admit the request and send the observation
(a part of PolicyNode).

At the control rate (and on a frame a due request waits for, and when another robot's chunk
frees an admission slot) the tick checks for a sensor loss or a policy outage
(mstar_ros.ros.pi05.safety_stops), then, when the action queue runs low
(mstar_ros.policy.chunking) and every sensor is fresh, takes an in-flight slot of the node set
(mstar_ros.policy.admission), waits for a fresher frame if asked to, and submits the
observation to the Conductor on its loop. The chunk comes back to ChunkPublishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from mstar.conductor import Conductor
from mstar.request import UnknownRequest
from mstar_ros.policy.admission import ChunkAdmission
from mstar_ros.policy.chunking import ActionChunker
from mstar_ros.ros.common.convert import image_to_array
from mstar_ros.ros.common.worker_health import first_down
from mstar_ros.ros.pi05.params import PolicyParams


@dataclass
class _Outgoing:
    request: object  # the runtime request (mstar.request.Request)
    oldest: float  # arrival (time.monotonic()) of the oldest sensor frame it uses
    epoch: int  # the node's sensor-loss epoch when it was sent: a later loss discards it


class ControlTick:
    """PolicyNode's control tick and admission."""

    def _start_control(self, p: PolicyParams, admission: ChunkAdmission | None) -> None:
        self.admission = admission or ChunkAdmission()
        self._due_since: float | None = None  # the pending request fell due then
        self._admitted_at: float | None = None  # ... and was admitted then (holds an in-flight slot)
        self.chunker = ActionChunker(
            self.policy.action_horizon,
            self.policy.action_dim,
            self.rate,
            refill_at=p.refill_at or None,
            smooth=p.smooth,
        )
        self._inflight_id: str | None = None  # the runtime request in flight (cancelled when overdue)
        self._busy = False
        self._n = 0
        self._truncation_said = False

    def _start_ticking(self) -> None:
        self.create_timer(1.0 / self.rate, self._tick)

    def _due_and_fed(self, now: float, worker_down: str | None) -> bool:
        """A chunk is due, the Workers are up and every sensor has given recent data (under the lock)."""
        if self.closing or self._busy or worker_down is not None or not self.chunker.needs_request(now):
            return False
        if not self.watch.has_all():
            return False  # waiting for every camera and the joint state
        age = self.watch.age(now, self._clock_now())
        if age > self.watch.max_age_s:  # a sensor went quiet: acting on old data is worse than waiting
            sensor = self.watch.oldest_sensor(now, self._clock_now())
            self._problem(
                ("old", self.get_namespace()),
                f"{self.get_namespace()}: sensor data is {age:.1f} s old ({sensor}); waiting",
                "WARN",
                count=None,
            )
            return False
        return True

    def _tick(self) -> None:
        """At the control rate, on a frame a due request waits for, and when another robot's
        chunk frees an admission slot: sends the request once it is due, admitted and fresh."""
        now = time.monotonic()
        request, refused, give_back, withdraw = None, None, False, False
        worker_down = first_down(self.conductor.worker_status())  # (cheap: no message to the Workers)
        with self._lock:
            loss_started = self._check_loss(now)
            outage_started, overdue_id = self._check_policy(now, worker_down)
            if self._due_and_fed(now, worker_down):
                request, refused = self._admitted_request(now)
            elif self._due_since is not None:  # it was due, but its sensors went quiet (or it closes):
                give_back, withdraw = self._admitted_at is not None, self._admitted_at is None
                self._due_since, self._admitted_at = None, None  # others need not wait for it
        if loss_started:
            self._on_sensor_loss()
        if overdue_id is not None:  # the runtime stops computing it and frees its KV
            asyncio.run_coroutine_threadsafe(_cancel(self.conductor, overdue_id), self.loop)
        if outage_started:
            self._on_policy_outage()
        if give_back or refused is not None:
            self.admission.release()
        if withdraw:
            self.admission.withdraw(self.get_namespace())
        if refused is not None:
            return self._problem(
                ("refused", self.get_namespace()),
                f"{self.get_namespace()}: observation refused: {refused}",
                "ERROR",
                count="observations_refused",
            )
        if request is not None:
            self._send(request)

    def _send(self, request: _Outgoing) -> None:
        """Submits an admitted request on the Conductor's loop; its chunk comes back to _on_chunk."""
        if request.request.meta.get("prompt_truncated") and not self._truncation_said:
            self._truncation_said = True
            self._say(
                f"{self.get_namespace()}: prompt {self.prompt!r} with the state is over the "
                f"checkpoint's tokenizer_max_length={self.policy.layout.config.max_token_len} tokens: cut "
                "to it, as the reference does (the state's end is lost: shorten the prompt)",
                "WARN",
            )
        oldest, epoch = request.oldest, request.epoch
        self._inflight_id = request.request.request_id
        future = asyncio.run_coroutine_threadsafe(_serve(self.conductor, request.request), self.loop)
        future.add_done_callback(lambda f: self._on_chunk(f, oldest, epoch))

    def _admitted_request(self, now: float) -> tuple[_Outgoing | None, ValueError | None]:
        """Under the lock, a request being due: (the request to send, or None while it waits
        for an admission slot or a fresher frame; the reason the observation was refused)."""
        self._due_since = now if self._due_since is None else self._due_since
        if self._admitted_at is None:
            if not self.admission.try_acquire(self.get_namespace(), self._due_since, self._tick):
                return None, None  # other robots' chunks fill the node set's in-flight limit
            self._admitted_at = now
        if self.freshness is not None and self.freshness.should_wait(now, self._admitted_at):
            return None, None
        self.stats.admission_waits += self._admitted_at > self._due_since
        self.stats.fresh_waits += now > self._admitted_at
        self._due_since = None
        oldest = self.watch.oldest_arrival()
        images = torch.from_numpy(np.stack([image_to_array(self._frames[t]) for t in self.cameras]))
        try:
            state = self.normalization.state.normalize(torch.from_numpy(self._state))
            guide, weights = self.chunker.begin_request(now)
            self._n += 1
            request = self.policy.request(
                images,
                state,
                self.task,
                seed=self._n,
                guide=guide,
                guide_weights=weights,
                request_id=f"{self.get_namespace().strip('/') or 'robot'}-{self._n}",
                priority=self.params.priority,
            )
        except ValueError as exc:
            self.chunker.pending, self._admitted_at = None, None
            return None, exc
        self._busy = True
        if self.stats.first_request is None:
            self.stats.first_request = now
        return _Outgoing(request, oldest, self._epoch), None


async def _serve(conductor: Conductor, request) -> dict:
    """On the Conductor's loop: submit() starts tasks, so it must run there, not on an rclpy thread."""
    return await conductor.submit(request).collect()


async def _cancel(conductor: Conductor, request_id: str) -> None:
    """Stops an overdue request in the runtime (its caller then hears RequestCancelled); it may have
    ended meanwhile."""
    with contextlib.suppress(UnknownRequest):
        await conductor.cancel(request_id)
