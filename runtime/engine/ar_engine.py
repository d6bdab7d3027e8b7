"""The AR engine: paged KV, continuous batching and sampling for one AR module (and its views).

Runs on its own thread. Calls arrive as ExecuteNode messages; replies go out as
NodeOutput messages through the callback that came with the call. Each call runs in
the loop of its ``loop_mode`` (mstar.engine.loop_contract): token Loops
(mstar.engine.token_loop), flow Loops (mstar.engine.flow_loop) and frame Loops
(mstar.engine.frame_loop), all over one EngineCore (the module, its KV, the scheduler).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.block_manager import BlockManager
from mstar.engine.config import EngineConfig
from mstar.engine.core_builder import build_core
from mstar.engine.device_loop import run_on_device
from mstar.engine.engine_inbox import EngineInbox, InboxMessage, Reply
from mstar.engine.flow_loop import FlowLoop
from mstar.engine.frame_loop import FrameLoop
from mstar.engine.kv_handoff import export_sequence
from mstar.engine.loop_contract import CallRefused, EngineLoop
from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput, ReleaseRequest
from mstar.engine.scheduler import Scheduler
from mstar.engine.token_loop import TokenLoop
from mstar.graph.loop_mode import LoopMode
from mstar.parallel.group import TPGroup
from mstar.priority import Priority
from mstar.transport.inprocess import InProcessTensorStore

log = logging.getLogger("mstar.engine.ar")
# the log line of a failed step, as it read before the loops shared one contract
STEP_NAMES = {LoopMode.TOKEN: "engine", LoopMode.FLOW: "flow", LoopMode.VELOCITY: "flow", LoopMode.FRAMES: "frame"}


class AREngine(EngineInbox):
    def __init__(
        self,
        module: ARModule,
        views: list[str],
        store: InProcessTensorStore,
        config: EngineConfig | None = None,
        device: str | torch.device = "cpu",
        name: str = "ar",
        tp: TPGroup | None = None,
    ) -> None:
        """``tp``: this engine is rank 0 of a tensor-parallel group whose other ranks run
        ``mstar.engine.tp_follower.TPFollower``; ``module`` is rank 0's shard. Blocks until they follow."""
        super().__init__()
        device = torch.device(device)
        config, _ = (config or EngineConfig()).for_device(device)
        self.name = name
        self.views = list(views)
        self.core = build_core(module, store, config, device, name, tp)
        self._tokens = TokenLoop(self.core)
        # stepped in this order: flows first, as reserving their suffix may preempt sequences the
        # token batch would hold; a velocity call is a one-evaluation flow: the flow loop runs it
        flows = FlowLoop(self.core)
        self.loops: dict[LoopMode, EngineLoop] = {
            LoopMode.FLOW: flows,
            LoopMode.VELOCITY: flows,
            LoopMode.FRAMES: FrameLoop(self.core),
            LoopMode.TOKEN: self._tokens,
        }

    @property
    def on_fatal(self) -> Callable[[str], None] | None:
        """Called when the engine cannot go on (a tensor-parallel group broke)."""
        return self.core.on_fatal

    @on_fatal.setter
    def on_fatal(self, callback: Callable[[str], None] | None) -> None:
        self.core.on_fatal = callback

    @property
    def blocks(self) -> BlockManager:
        return self.core.blocks

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    def close_session(self, session_id: str) -> None:
        self._post(CloseSession(session_id))

    def close(self) -> None:
        """Ends the engine's tensor-parallel followers (no-op without TP); the engine cannot
        step afterwards. Call once its device loop stopped (``stop()`` does)."""
        leader = self.core.tp_leader
        if leader is not None and not leader.closed:
            run_on_device(leader.close)

    def stop(self) -> None:
        super().stop()
        self.close()

    def feed(self, msg: FeedInput) -> None:
        """More rows for a fed input of a running call (mstar.engine.fed_inputs)."""
        self._post(msg)

    def export_kv(self, msg: ExportKV, reply: Callable[[KVExported], None]) -> None:
        """Hands a sequence to another Worker: replies KVExported and forgets the sequence."""
        self._post(msg, reply)

    def stats(self) -> dict[str, int]:
        stats = self.core.stats()
        for loop in self._distinct_loops().values():
            stats.update(loop.stats())
        return stats

    def _distinct_loops(self) -> dict[LoopMode, EngineLoop]:
        """Each loop once (one may run several modes), under its first mode, in stepping order."""
        seen: dict[int, tuple[LoopMode, EngineLoop]] = {}
        for mode, loop in self.loops.items():
            seen.setdefault(id(loop), (mode, loop))
        return dict(seen.values())

    # -- device thread (DeviceLoop) -------------------------------------------------
    def has_work(self) -> bool:
        return any(loop.has_work() for loop in self._distinct_loops().values())

    has_pending = has_work

    def most_urgent(self, pending: bool = False) -> Priority | None:
        """The most urgent class of the work due in any of its loops (None: nothing is due; all its
        queued work is due work, so ``pending`` changes nothing)."""
        classes = [loop.most_urgent() for loop in self._distinct_loops().values()]
        return min((c for c in classes if c is not None), default=None)

    def due_classes(self) -> set[Priority]:
        """The most urgent class due in each of its loops: the device thread's starvation guard sees a
        batch flow waiting behind an interactive decode of the same engine."""
        return {c for loop in self._distinct_loops().values() if (c := loop.most_urgent()) is not None}

    def step(self, limit: Priority | None = None) -> None:
        """One step of each loop whose due work is of class ``limit`` or more urgent (None: of every
        loop). Why: a BAGEL flow step (~2 s) must not ride along with every interactive decode step;
        less urgent loops wait for a round of their class or the starvation guard's step."""
        loops = [
            (mode, loop)
            for mode, loop in self._distinct_loops().items()
            if limit is None or ((c := loop.most_urgent()) is not None and c <= limit)
        ]
        done = sum(self._step_loop(mode, loop, limit) for mode, loop in loops)
        if not done:
            time.sleep(0.001)  # everything waits for KV held by running sequences

    def _step_loop(self, mode: LoopMode, loop: EngineLoop, limit: Priority | None) -> int:
        try:
            return loop.step(limit)
        except Exception as exc:
            log.exception("%s %s step failed", self.name, STEP_NAMES[mode])
            loop.fail_all(exc)
            return 0

    def _handle(self, msg: InboxMessage, reply: Callable | None = None) -> None:
        try:
            match msg:
                case ExecuteNode():
                    self._start(msg, reply)
                case ReleaseRequest(request_id=request_id):
                    self.core.store.free_owner(request_id)  # outputs made after the Conductor let go of it
                    for loop in self._distinct_loops().values():
                        loop.release(request_id)
                case FeedInput():
                    self._tokens.feed(msg)
                case ExportKV():
                    reply(export_sequence(self.core, msg))
                case CloseSession(session_id=session_id):
                    for loop in self._distinct_loops().values():
                        loop.close_session(session_id)
        except CallRefused as exc:  # the caller's mistake: the reply says it all
            reply(NodeOutput(msg.call_id, msg.request_id, 0, final=True, error=str(exc)))
        except Exception as exc:  # a bad message must not stop the engine
            log.exception("%s engine: %s failed", self.name, type(msg).__name__)
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(msg, ExecuteNode) and reply is not None:
                reply(NodeOutput(msg.call_id, msg.request_id, 0, final=True, error=error))
            elif isinstance(msg, ExportKV) and reply is not None:
                reply(KVExported(msg.call_id, msg.request_id, error=error))

    def _start(self, msg: ExecuteNode, reply: Reply) -> None:
        """Hands ``msg`` to the loop of its mode once the checks every call passes hold."""
        if msg.node not in self.views:
            raise CallRefused(f"node {msg.node!r} is not served by engine {self.name!r}")
        owner = msg.session_id or msg.request_id
        seq = self.core.scheduler.seqs.get((owner, msg.node))
        if seq is not None and seq.call is not None:
            raise CallRefused(f"node {msg.node!r} already has a call in flight for {owner!r}")
        try:
            loop = self.loops[LoopMode.parse(msg.loop_mode)]
        except (ValueError, KeyError):
            raise CallRefused(
                f"node {msg.node!r}: engine {self.name!r} runs no loop of mode {msg.loop_mode!r} "
                f"(it runs {[mode.value for mode in self.loops]})"
            ) from None
        loop.start(msg, reply)
