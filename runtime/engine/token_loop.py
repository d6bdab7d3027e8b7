"""Token Loops: continuous batching of prefill and decode, sampling, tokens fed back in the engine.

A call with a LoopSpec is an engine-resident loop: the sampled token is fed back each
iteration and the stop check happens here, next to the model, so no round trip to the
Conductor is on the per-token path.
"""

from __future__ import annotations

import torch

from mstar.engine.engine_core import EngineCore
from mstar.engine.engine_inbox import Reply
from mstar.engine.fed_inputs import append_fed, as_rows
from mstar.engine.loop_contract import EngineLoop
from mstar.engine.messages import ExecuteNode, FeedInput
from mstar.engine.scheduler import ScheduledSeq
from mstar.engine.sequence import SeqStatus, Sequence
from mstar.engine.step_feedback import keep_rows
from mstar.engine.token_admission import admit_token_call
from mstar.engine.token_outputs import finish_step
from mstar.priority import Priority


def _is_token(seq: Sequence) -> bool:
    return seq.flow is None  # the scheduler also holds flow sequences (mstar.engine.flow_loop)


class TokenLoop(EngineLoop):
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.steps = 0
        self.tokens_computed = 0
        self._stepping: list[ScheduledSeq] = []  # the batch of a step in progress (for fail_all)

    def start(self, msg: ExecuteNode, reply: Reply) -> None:
        admit_token_call(self.core, msg, reply)

    def has_work(self) -> bool:
        return self.core.scheduler.has_work()

    def most_urgent(self) -> Priority | None:
        return self.core.scheduler.most_urgent()

    def step(self, limit: Priority | None = None) -> int:
        """One continuous-batching step; ``limit`` is not applied inside it: a decode row of a less
        urgent call adds little to the step (the scheduler orders rows by class)."""
        core = self.core
        batch = core.scheduler.schedule()
        for seq in core.scheduler.take_stuck():  # can never fit, even with everything else preempted
            core.fail_call(
                seq,
                f"node {seq.node!r}: the KV pool ({core.blocks.num_blocks} blocks of "
                f"{core.blocks.block_size}) cannot hold this sequence ({len(seq.token_ids)} tokens)",
            )
            core.scheduler.drop(seq)
        if not batch:
            return 0
        self.steps += 1
        self.tokens_computed += sum(item.num_tokens for item in batch)
        self._stepping = batch
        with core.busy(), torch.inference_mode():
            samples = any(
                item.seq.call is not None and item.seq.call.wants_token and item.end == len(item.seq.token_ids)
                for item in batch
            )
            hidden, last_rows = core.runner.run(batch, need_hidden=samples, last_rows_only=True)
            keep_rows(core.module, batch)
            core.scheduler.complete(batch)
            finish_step(core, batch, hidden, last_rows)
        self._stepping = []
        return len(batch)

    def fail_all(self, error: Exception) -> None:
        """Calls in flight fail; every sequence of the batch keeps its tokens and is recomputed."""
        core = self.core
        text = f"engine step failed: {type(error).__name__}: {error}"
        if core.tp_leader is not None:  # the ranks are out of step now: the group must restart
            text = (
                f"tensor-parallel step failed (a rank of the group is gone or failed): "
                f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
            )
        batch, self._stepping = self._stepping, []
        for item in batch:
            seq = item.seq
            if seq.call is not None:
                seq.truncate(seq.call.context_before)
                core.fail_call(seq, text)
            seq.status = SeqStatus.IDLE
            core.scheduler.preempt(seq)
            seq.status = SeqStatus.IDLE
        if batch and core.tp_leader is not None and core.on_fatal is not None:
            core.on_fatal(text)

    def release(self, request_id: str) -> None:
        self.core.release_sequences(request_id, _is_token)

    def close_session(self, session_id: str) -> None:
        self.core.close_sequences(session_id, _is_token)

    def stats(self) -> dict[str, int]:
        scheduler = self.core.scheduler
        return {
            "sequences": len(scheduler.seqs),
            "steps": self.steps,
            "tokens_computed": self.tokens_computed,
            "preemptions": scheduler.num_preemptions,
            "phase_waits": scheduler.phase_waits,
            "feed_waits": scheduler.feed_waits,
        }

    def feed(self, msg: FeedInput) -> None:
        """More rows for a fed input of a running call (mstar.engine.fed_inputs)."""
        core = self.core
        seq = core.scheduler.seqs.get((msg.session_id or msg.request_id, msg.node))
        if seq is None or seq.call is None or seq.request_id != msg.request_id:
            return  # the call ended (its Loop stopped, or it was cancelled): the rest is not needed
        try:
            rows = as_rows(core.store.resolve(msg.items)) if msg.items else None
            append_fed(seq, msg, rows)
        except Exception as exc:  # bad rows fail this call alone
            core.fail_call(seq, f"{type(exc).__name__}: {exc}")
            core.scheduler.drop(seq)
