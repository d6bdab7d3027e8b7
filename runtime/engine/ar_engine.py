"""The AR engine: paged KV, continuous batching and sampling for one AR module (and its views).

Runs on its own thread. Calls arrive as ExecuteNode messages; replies go out as
NodeOutput messages through the callback that came with the call. A call with a
LoopSpec is an engine-resident loop: the sampled token is fed back each iteration
and the stop check happens here, next to the model, so no round trip to the
Conductor is on the per-token path.
"""
from __future__ import annotations

import logging
import math
import time

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.select import select_attention_backend
from mstar.engine.block_manager import BlockManager, BlockTable
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.engine.engine_inbox import EngineInbox, Reply
from mstar.engine.fed_inputs import append_fed, as_rows, waits_for_rows
from mstar.engine.flow_loop import FlowLoops
from mstar.engine.frame_loop import FrameLoops
from mstar.engine.frame_module import FrameModule
from mstar.engine.kv_cache import PagedKVCache
from mstar.engine.kv_migration import gather_kv, restore_sequence, sequence_state
from mstar.engine.messages import ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput
from mstar.engine.model_runner import ModelRunner
from mstar.engine.rope_positions import set_rope_positions
from mstar.engine.sampler import Sampler
from mstar.engine.scheduler import ScheduledSeq, Scheduler
from mstar.engine.sequence import ActiveCall, Sequence, SeqStatus
from mstar.engine.step_feedback import (CORE_INPUTS, append_embed_row, feedback_rows, keep_rows, last_sample,
                                        row_outputs)
from mstar.engine.tp_plan import Hello, TPLeader
from mstar.layers.linear_packing import pack_linears, packed_count
from mstar.layers.vocab_constraint import union_vocab
from mstar.parallel.group import TPGroup
from mstar.transport.inprocess import InProcessTensorStore

log = logging.getLogger("mstar.engine.ar")


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def block_size_for(module: ARModule, config: EngineConfig) -> int:
    """A frame module's KV block is one frame (its samples then share whole frames); else the config's."""
    return module.frame_tokens if isinstance(module, FrameModule) else config.block_size


def _kv_blocks(module: ARModule, config: EngineConfig, kv_dtype: torch.dtype) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = module.kv_spec().bytes_per_token(kv_dtype) * block_size_for(module, config)
    return max(1, int(config.kv_cache_mb * 2**20) // per_block)


class AREngine(EngineInbox):
    def __init__(self, module: ARModule, views: list[str], store: InProcessTensorStore,
                 config: EngineConfig | None = None, device: str | torch.device = "cpu", name: str = "ar",
                 tp: TPGroup | None = None) -> None:
        """``tp``: this engine is rank 0 of a tensor-parallel group whose other ranks run
        ``mstar.parallel.TPFollower``; ``module`` is rank 0's shard. Blocks until they follow."""
        super().__init__()
        self.device = torch.device(device)
        self.config, _ = (config or EngineConfig()).for_device(self.device)
        self.name = name
        self.views = list(views)
        self.store = store
        dtype = _dtype(self.config.dtype)
        kv_dtype = _dtype(self.config.kv_dtype or self.config.dtype)
        self.module = module.to(device=self.device, dtype=dtype).eval()
        if self.config.pack_linears:
            pack_linears(self.module, module.plain_linears)
        packed = packed_count(self.module)
        num_blocks = _kv_blocks(module, self.config, kv_dtype)
        block_size = block_size_for(module, self.config)
        self.cache = PagedKVCache(module.kv_spec(), num_blocks, block_size, kv_dtype, self.device)
        self.blocks = BlockManager(num_blocks, block_size)
        self.backend = select_attention_backend(self.cache, self.config.attention_backend)
        self.tp_leader = TPLeader(tp) if tp is not None and tp.size > 1 else None
        leader = self.tp_leader
        self.scheduler = Scheduler(self.blocks, leader.track_copies(self.cache) if leader else self.cache, self.config,
                                   period=module.decode_period() if self.config.phase_align else 1,
                                   waits=lambda seq: waits_for_rows(self.module, seq))
        self.runner = ModelRunner(self.module, self.backend, self.blocks, self.device,
                                  plan_hook=leader.forward_plan if leader else None)
        if leader is not None:  # followers size their KV pools and pick dtypes from this
            leader.hello(Hello(num_blocks, block_size, str(dtype).removeprefix("torch."),
                               str(kv_dtype).removeprefix("torch."), self.backend.name,
                               pack_linears=self.config.pack_linears))
        self.sampler = Sampler()
        self.flows = FlowLoops(self)
        self.frame_loops = FrameLoops(self)
        self.on_fatal = None  # called when the engine cannot go on (a tensor-parallel group broke)
        self.steps = 0
        self.tokens_computed = 0
        self.busy_seconds = 0.0  # time inside model steps (to tell compute from overhead)
        log.info("%s engine: %d KV blocks x %d tokens (%s), attention backend %s, %d linears packed",
                 name, num_blocks, block_size, kv_dtype, self.backend.name, packed)

    def close_session(self, session_id: str) -> None:
        self._post("close_session", session_id)

    def close(self) -> None:
        """Ends the engine's tensor-parallel followers (no-op without TP); the engine cannot
        step afterwards. Call once its device loop stopped (``stop()`` does)."""
        if self.tp_leader is not None and not self.tp_leader.closed:
            run_on_device(self.tp_leader.close)

    def stop(self) -> None:
        super().stop()
        self.close()

    def feed(self, msg: FeedInput) -> None:
        """More rows for a fed input of a running call (mstar.engine.fed_inputs)."""
        self._post("feed", msg)

    def export_kv(self, msg: ExportKV, reply) -> None:
        """Hands a sequence to another Worker: replies KVExported and forgets the sequence."""
        self._post("export_kv", msg, reply)

    def stats(self) -> dict[str, int]:
        return {"kv_blocks_total": self.blocks.num_blocks, "kv_blocks_used": self.blocks.num_used_blocks,
                "sequences": len(self.scheduler.seqs), "steps": self.steps,
                "tokens_computed": self.tokens_computed, "preemptions": self.scheduler.num_preemptions,
                "phase_waits": self.scheduler.phase_waits, "feed_waits": self.scheduler.feed_waits,
                "busy_ms": int(self.busy_seconds * 1000), "forward_ms": int(self.runner.forward_seconds * 1000),
                **(self.frame_loops.stats() if isinstance(self.module, FrameModule) else {})}

    # -- device thread (DeviceLoop) -------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.flows.has_work() or self.frame_loops.has_work()

    has_pending = has_work

    def step(self) -> None:
        self._step()

    def _handle(self, kind: str, arg, reply: Reply | None) -> None:
        try:
            if kind == "call":
                self._on_call(arg, reply)
            elif kind == "release":
                self._on_release(arg)
            elif kind == "feed":
                self._on_feed(arg)
            elif kind == "export_kv":
                self._on_export_kv(arg, reply)
            elif kind == "close_session":
                self.frame_loops.close_session(arg)
                for seq in [s for s in self.scheduler.seqs.values() if s.owner == arg]:
                    self._fail_call(seq, f"session {arg!r} was closed")
                    self.scheduler.drop(seq)
        except Exception as exc:  # a bad message must not stop the engine
            log.exception("%s engine: %s failed", self.name, kind)
            if kind == "call" and reply is not None:
                reply(NodeOutput(arg.call_id, arg.request_id, 0, final=True, error=f"{type(exc).__name__}: {exc}"))
            elif kind == "export_kv" and reply is not None:
                reply(KVExported(arg.call_id, arg.request_id, error=f"{type(exc).__name__}: {exc}"))

    def _on_feed(self, msg: FeedInput) -> None:
        seq = self.scheduler.seqs.get((msg.session_id or msg.request_id, msg.node))
        if seq is None or seq.call is None or seq.request_id != msg.request_id:
            return  # the call ended (its Loop stopped, or it was cancelled): the rest is not needed
        try:
            rows = as_rows(self.store.resolve(msg.items)) if msg.items else None
            append_fed(seq, msg, rows)
        except Exception as exc:  # bad rows fail this call alone
            self._fail_call(seq, f"{type(exc).__name__}: {exc}")
            self.scheduler.drop(seq)

    def _on_call(self, msg: ExecuteNode, reply: Reply) -> None:
        def fail(text: str) -> None:
            reply(NodeOutput(msg.call_id, msg.request_id, 0, final=True, error=text))

        if msg.node not in self.views:
            return fail(f"node {msg.node!r} is not served by engine {self.name!r}")
        owner = msg.session_id or msg.request_id
        seq = self.scheduler.seqs.get((owner, msg.node))
        if seq is not None and seq.call is not None:
            return fail(f"node {msg.node!r} already has a call in flight for {owner!r}")
        if msg.frames:
            if not isinstance(self.module, FrameModule):
                return fail(f"node {msg.node!r} is a frame node but module {type(self.module).__name__} is no FrameModule")
            if self.tp_leader is not None:
                return fail(f"frame node {msg.node!r}: frame Loops are not supported with tensor parallelism yet")
            return self.frame_loops.start(msg, reply)
        if msg.flow:
            if self.tp_leader is not None:
                return fail(f"flow node {msg.node!r}: flow Loops are not supported with tensor parallelism yet")
            return self.flows.start(msg, reply)
        if seq is None and msg.kv_import is not None:
            seq = self._import_sequence(msg)
        ref = msg.inputs.get("input_ids")
        ids = [] if ref is None else self.store.resolve(ref).reshape(-1).tolist()
        vocab = self.module.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            return fail(f"node {msg.node!r}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        known = 0 if seq is None else len(seq.token_ids)
        if known + len(ids) == 0 or (seq is not None and seq.num_pending + len(ids) == 0 and msg.sampling is not None):
            return fail(f"node {msg.node!r}: call has no input tokens")
        loop_iters = 1 if msg.loop is None else (msg.loop.max_iters or 0)
        first = 0 if seq is None else seq.table.first_position
        need = first + known + len(ids) + loop_iters
        if msg.kv_window is None and need > self.module.max_positions:
            return fail(f"node {msg.node!r}: request needs {need} positions ({known + len(ids)} tokens in context "
                        f"+ {loop_iters} to generate), over the model's context limit of {self.module.max_positions}")
        window = msg.kv_window if msg.kv_window is not None else known + len(ids) + loop_iters
        blocks_needed = math.ceil(min(window + self.blocks.block_size, known + len(ids) + loop_iters) / self.blocks.block_size)
        if blocks_needed > self.blocks.num_blocks:
            return fail(f"node {msg.node!r}: request needs {blocks_needed} KV blocks, the pool has {self.blocks.num_blocks}")
        if seq is None:
            seq = self._new_sequence(msg, owner)
        seq.request_id = msg.request_id
        context_before = len(seq.token_ids)
        if "embeds" in msg.inputs:
            self._append_embeds(seq, msg, len(ids), context_before)
        if "rope_positions" in msg.inputs:
            if not getattr(self.module, "accepts_rope_positions", False):
                raise ValueError(f"node {msg.node!r}: this model takes no rope_positions")
            if msg.kv_window is not None:  # eviction would shift token indices under the kept positions
                raise ValueError(f"node {msg.node!r}: rope_positions do not support a kv_window yet")
            set_rope_positions(seq, self.store.resolve(msg.inputs["rope_positions"]), len(ids), context_before, msg.node)
        seq.token_ids.extend(ids)
        if self.module.prompt_in_history:
            seq.history.extend(ids)
        unknown = [p for p in msg.fed_inputs if p in CORE_INPUTS]
        if unknown or (msg.fed_inputs and (msg.loop is None or not self.module.has_feedback)):
            raise ValueError(f"node {msg.node!r}: fed inputs {list(msg.fed_inputs)} need a Loop call of a module with "
                             f"feedback, and cannot be {list(CORE_INPUTS)}")
        for name, ref in msg.inputs.items():  # a feedback hook reads them on every later iteration
            if name not in CORE_INPUTS and self.module.has_feedback:
                value = self.store.resolve(ref)
                seq.side_inputs[name] = as_rows(value) if name in msg.fed_inputs else value
        seq.open_inputs = set(msg.fed_inputs)
        seq.mask, seq.mask_arg, seq.kv_window = msg.mask, msg.mask_arg, msg.kv_window
        seq.call = ActiveCall(msg, reply, context_before=context_before, rows_sent=context_before)
        seq.status = SeqStatus.RUNNING if seq.table.blocks else SeqStatus.WAITING
        if msg.session_id is not None:
            seq.arrival = time.monotonic()  # a session's new message queues behind earlier requests

    def _new_sequence(self, msg: ExecuteNode, owner: str) -> Sequence:
        seq = Sequence(owner=owner, node=msg.node, request_id=msg.request_id, table=BlockTable(blocks=[]))
        source = self.scheduler.seqs.get((owner, msg.kv_from)) if msg.kv_from else None
        if msg.kv_from and (source is None or source.call is not None):
            state = "has no KV yet" if source is None else "is still running"
            raise ValueError(f"node {msg.node!r} forks its KV from {msg.kv_from!r}, which {state} for {owner!r}")
        if source is not None:
            if source.table.blocks:  # copy-on-write fork: shares every computed block with the source view
                seq.table = self.blocks.fork(source.table)
                seq.num_computed = source.num_computed
                seq.token_ids = list(source.token_ids[:source.num_computed])
            else:  # the source was preempted: same tokens, recomputed
                seq.table.first_position = source.table.first_position
                seq.token_ids = list(source.token_ids)
            seq.history = list(source.history)
            seq.mask, seq.mask_arg = source.mask, source.mask_arg  # a recompute must see what the source saw
            if source.embeds is not None:
                n = len(seq.token_ids)
                seq.embeds, seq.embed_mask = source.embeds[:n], source.embed_mask[:n]
            seq.rope_positions, seq.rope_after = source.rope_positions, source.rope_after
            seq.num_generated = source.num_generated
            seq.arrival = source.arrival
        node_salt = sum(ord(c) * 31**i for i, c in enumerate(msg.node)) % 1_000_003  # stable across runs
        seq.generator = torch.Generator(device="cpu").manual_seed((msg.seed * 1_000_003 + node_salt) % (2**63))
        self.scheduler.seqs[seq.key] = seq
        return seq

    def _append_embeds(self, seq: Sequence, msg: ExecuteNode, count: int, before: int) -> None:
        """Rows of this call that enter as embeddings: ``embed_mask`` [count] marks them,
        ``embeds`` holds one row per marked token, in order."""
        if "embed_mask" not in msg.inputs:
            raise ValueError(f"node {msg.node!r}: input 'embeds' needs 'embed_mask' (which tokens they replace)")
        rows = self.store.resolve(msg.inputs["embeds"])
        mask = self.store.resolve(msg.inputs["embed_mask"]).reshape(-1).bool()
        rows = rows.reshape(-1, rows.shape[-1]) if rows.dim() > 2 else rows
        if mask.numel() != count or rows.dim() != 2 or rows.shape[0] != int(mask.sum()):
            raise ValueError(f"node {msg.node!r}: embed_mask marks {int(mask.sum())} of {mask.numel()} tokens "
                             f"({count} given) but embeds has shape {tuple(rows.shape)}")
        if not torch.isfinite(rows).all():
            raise ValueError(f"node {msg.node!r}: embeds contain NaN or infinite values")
        dense = torch.zeros(count, rows.shape[1], dtype=torch.float32)
        dense[mask] = rows.float()
        if seq.embeds is None:
            seq.embeds = torch.zeros(before, rows.shape[1])
            seq.embed_mask = torch.zeros(before, dtype=torch.bool)
        seq.embeds = torch.cat([seq.embeds[:before], dense])
        seq.embed_mask = torch.cat([seq.embed_mask[:before], mask])

    def _import_sequence(self, msg: ExecuteNode) -> Sequence:
        state = msg.kv_import
        assert state is not None
        kv = self.store.get(state.kv) if state.kv is not None else None
        seq = restore_sequence(state, kv, msg.request_id, self.blocks, self.cache)
        self.scheduler.seqs[seq.key] = seq
        return seq

    def _on_export_kv(self, msg: ExportKV, reply) -> None:
        seq = self.scheduler.seqs.get((msg.owner, msg.node))
        if seq is None:
            return reply(KVExported(msg.call_id, msg.request_id, error=f"engine {self.name!r} holds no sequence "
                                                                      f"of node {msg.node!r} for {msg.owner!r}"))
        if seq.call is not None:
            return reply(KVExported(msg.call_id, msg.request_id, error=f"node {msg.node!r} of {msg.owner!r} is still running"))
        if seq.embeds is not None or seq.rope_positions is not None:  # needed for any recompute there
            return reply(KVExported(msg.call_id, msg.request_id, error=f"node {msg.node!r}: a sequence with "
                                                                      f"embedding or rope_positions inputs cannot move between Workers yet"))
        if self.tp_leader is not None:  # the other ranks' KV heads would stay behind
            return reply(KVExported(msg.call_id, msg.request_id, error=f"node {msg.node!r} is tensor-parallel: "
                                                                      f"moving its KV between Workers is not supported"))
        kv = gather_kv(seq, self.blocks, self.cache)
        handle = None
        if kv is not None:
            handle = self.store.put(kv, owner=msg.request_id)
            if msg.transport != "inproc":
                handle = self.store.export(handle, msg.transport)  # type: ignore[attr-defined]
        state = sequence_state(seq, handle)
        self.scheduler.drop(seq)
        reply(KVExported(msg.call_id, msg.request_id, state=state))

    def _on_release(self, request_id: str) -> None:
        self.store.free_owner(request_id)  # outputs made after the Conductor let go of the request
        self.frame_loops.release(request_id)
        for seq in list(self.scheduler.seqs.values()):
            if seq.request_id != request_id:
                continue
            if seq.owner == request_id:
                self.scheduler.drop(seq)
            else:  # a session keeps its history; the abandoned call's uncomputed tokens go
                keep = max(seq.num_computed, seq.call.context_before if seq.call else len(seq.token_ids))
                seq.call = None
                del seq.token_ids[keep:]
                seq.status = SeqStatus.IDLE

    def _flow_step(self) -> int:
        started = time.perf_counter()
        done = 0
        try:
            done = self.flows.step()
        except Exception as exc:
            log.exception("%s flow step failed", self.name)
            for seq in [s for s in self.scheduler.seqs.values() if s.flow is not None and s.call is not None]:
                self._fail_call(seq, f"flow step failed: {type(exc).__name__}: {exc}")
                self.scheduler.drop(seq)
        self.busy_seconds += time.perf_counter() - started
        return done

    def _frame_step(self) -> int:
        started = time.perf_counter()
        done = 0
        try:
            done = self.frame_loops.step()
        except Exception as exc:  # the step's frame calls fail; contexts it was extending start again (fail_all)
            log.exception("%s frame step failed", self.name)
            self.frame_loops.fail_all(f"frame step failed: {type(exc).__name__}: {exc}")
        self.busy_seconds += time.perf_counter() - started
        return done

    def _fail_call(self, seq: Sequence, error: str) -> None:
        call, seq.call = seq.call, None
        if call is not None:
            call.reply(NodeOutput(call.msg.call_id, call.msg.request_id, call.iteration, final=True, error=error))

    def _step(self) -> None:
        # flows first: reserving their suffix may preempt sequences the token batch would hold
        flowed = self._flow_step() if self.flows.has_work() else 0
        if self.frame_loops.has_work():
            flowed += self._frame_step()
        batch = self.scheduler.schedule()
        for seq in self.scheduler.take_stuck():  # can never fit, even with everything else preempted
            self._fail_call(seq, f"node {seq.node!r}: the KV pool ({self.blocks.num_blocks} blocks of "
                                 f"{self.blocks.block_size}) cannot hold this sequence ({len(seq.token_ids)} tokens)")
            self.scheduler.drop(seq)
        if not batch:
            if not flowed:
                time.sleep(0.001)  # everything waits for KV held by running sequences
            return
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                samples = any(item.seq.call is not None and item.seq.call.wants_token
                              and item.end == len(item.seq.token_ids) for item in batch)
                hidden, last_rows = self.runner.run(batch, need_hidden=samples)
                keep_rows(self.module, batch)
                self.scheduler.complete(batch)
                self._finish_step(batch, hidden, last_rows)
        except Exception as exc:
            log.exception("%s engine step failed", self.name)
            text = f"engine step failed: {type(exc).__name__}: {exc}"
            if self.tp_leader is not None:  # the ranks are out of step now: the group must restart
                text = (f"tensor-parallel step failed (a rank of the group is gone or failed): "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            for item in batch:  # calls in flight fail; every sequence keeps its tokens and is recomputed
                seq = item.seq
                if seq.call is not None:
                    del seq.token_ids[seq.call.context_before:]
                    self._fail_call(seq, text)
                seq.status = SeqStatus.IDLE
                self.scheduler.preempt(seq)
                seq.status = SeqStatus.IDLE
            if self.tp_leader is not None and self.on_fatal is not None:
                self.on_fatal(text)
        self.busy_seconds += time.perf_counter() - started
        self.steps += 1
        self.tokens_computed += sum(item.num_tokens for item in batch)

    def _finish_step(self, batch: list[ScheduledSeq], hidden: torch.Tensor, last_rows: list[int]) -> None:
        sample_seqs, rows = [], []
        for item, row in zip(batch, last_rows):
            seq = item.seq
            if seq.num_pending > 0 or seq.call is None or seq.flow is not None:
                continue  # a prefill chunk; more to come
            if seq.call.wants_token:
                sample_seqs.append(seq)
                rows.append(row)
            else:
                call, seq.call = seq.call, None
                seq.status = SeqStatus.IDLE
                call.reply(NodeOutput(call.msg.call_id, call.msg.request_id, call.iteration, self._rows(seq),
                                      final=True, finish_reason="done"))
        if not sample_seqs:
            return
        # Rows that allow the same token ranges share one restricted LM head: a union over the
        # batch (Orpheus: up to 7 slots x 4096) would compute and mask ~7x the logits needed.
        groups: dict[object, list[int]] = {}
        ranges = [self.module.allowed_token_ranges(s.num_generated) for s in sample_seqs]
        for i, r in enumerate(ranges):
            groups.setdefault(None if r is None else tuple(r), []).append(i)
        tokens: list[int] = [0] * len(sample_seqs)
        for members in groups.values():
            seqs = [sample_seqs[i] for i in members]
            group_rows = [rows[i] for i in members]
            group_ranges = [ranges[i] for i in members]
            vocab = union_vocab(group_ranges, hidden.device)
            if self.tp_leader is not None:  # followers take part in the sharded LM head
                self.tp_leader.logits_plan(group_rows, vocab)
            # every row of the group allows exactly ``vocab``: nothing to mask
            logits = self.module.compute_logits(hidden[group_rows], vocab).float()
            picked = self.sampler.sample(logits, vocab, [s.call.msg.sampling for s in seqs],
                                         [s.history for s in seqs], [s.generator for s in seqs])
            for i, token in zip(members, picked):
                tokens[i] = token
        continuing = [self._continues(seq, token) for seq, token in zip(sample_seqs, tokens)]
        fed = feedback_rows(self.module, sample_seqs, tokens, hidden, rows, continuing)
        for seq, token in zip(sample_seqs, tokens):
            self._advance(seq, token, fed.get(seq.key))

    def _continues(self, seq: Sequence, token: int) -> bool:
        """Whether the call's Loop feeds ``token`` back for another iteration."""
        call = seq.call
        assert call is not None
        if call.msg.loop is None or token in call.msg.loop.stop_values or last_sample(self.module, seq):
            return False
        return seq.kv_window is not None or seq.table.first_position + len(seq.token_ids) + 1 < self.module.max_positions

    def _rows(self, seq: Sequence, outputs: dict | None = None, call: ActiveCall | None = None) -> dict:
        """``outputs`` plus the sequence's row outputs (every computed row), as tensor handles; for a
        call that streams its step rows, only the rows since its last output (``step_<name>``)."""
        outputs = dict(outputs or {})
        if call is not None and call.msg.step_rows:
            return self._step_rows(seq, call, outputs)
        for name, rows in row_outputs(seq).items():
            outputs[name] = self.store.put(rows, owner=seq.request_id)
        return outputs

    def _step_rows(self, seq: Sequence, call: ActiveCall, outputs: dict) -> dict:
        end = seq.num_computed
        if end > call.rows_sent:
            for name, rows in seq.rows.items():
                outputs[f"step_{name}"] = self.store.put(rows[call.rows_sent:end].clone(), owner=seq.request_id)
            call.rows_sent = end
        return outputs

    def _advance(self, seq: Sequence, token: int, fed: tuple[torch.Tensor, dict] | None = None) -> None:
        call = seq.call
        assert call is not None
        msg, iteration = call.msg, call.iteration
        continues = self._continues(seq, token)
        call.iteration += 1
        if msg.loop is not None and token in msg.loop.stop_values:
            seq.call, seq.status = None, SeqStatus.IDLE
            call.reply(NodeOutput(msg.call_id, msg.request_id, iteration, self._rows(seq, call=call), final=True,
                                  finish_reason="stop"))
            return
        seq.num_generated += 1
        seq.history.append(token)
        outputs = {"token": self.store.put(torch.tensor(token, dtype=torch.long), owner=msg.request_id)}
        last = not continues
        if last:
            seq.call, seq.status = None, SeqStatus.IDLE
            outputs = self._rows(seq, outputs, call)
        else:
            if msg.step_rows:
                self._step_rows(seq, call, outputs)
            seq.token_ids.append(token)  # loop feedback: next iteration's input
            if fed is not None:  # ... as the row the module computed for it
                row, extra = fed
                append_embed_row(seq, row)
                for name, value in extra.items():
                    outputs[name] = self.store.put(value, owner=msg.request_id)
        reason = ("length" if msg.loop is not None else "done") if last else None
        call.reply(NodeOutput(msg.call_id, msg.request_id, iteration, outputs, final=last, finish_reason=reason))
