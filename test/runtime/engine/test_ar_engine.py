"""AREngine driven directly with ExecuteNode messages (no Conductor): calls, engine-resident
loops, stop values, admission errors, release / sessions, sliding windows, step failures."""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import threading
import time

import pytest
import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.engine.messages import ExecuteNode, FeedInput, LoopSpec, NodeOutput, ReleaseRequest
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore
from support.toy_models import ToyLM

GREEDY = SamplingParams()
LM = ToyLM()


class Harness:
    def __init__(self, module=None, **cfg) -> None:
        self.store = InProcessTensorStore()
        config = EngineConfig(**{"num_kv_blocks": 64, "block_size": 4, **cfg})
        self.engine = AREngine(module or LM, ["llm"], self.store, config)
        self.ids = itertools.count()
        self.engine.start()

    def close(self) -> None:
        self.engine.stop()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(
        self,
        request_id: str,
        ids=None,
        *,
        loop: LoopSpec | None = None,
        sampling=GREEDY,
        session_id=None,
        kv_window=None,
        node="llm",
        seed=0,
        on_reply=None,
    ) -> queue.Queue[NodeOutput]:
        replies: queue.Queue[NodeOutput] = queue.Queue()
        inputs = (
            {} if ids is None else {"input_ids": self.store.put(torch.tensor(ids, dtype=torch.long), owner=request_id)}
        )
        msg = ExecuteNode(
            call_id=next(self.ids),
            request_id=request_id,
            node=node,
            inputs=inputs,
            seed=seed,
            sampling=sampling,
            loop=loop,
            session_id=session_id,
            kv_window=kv_window,
        )

        def reply(out: NodeOutput) -> None:
            if on_reply is not None:
                on_reply(out)
            replies.put(out)

        self.engine.submit(msg, reply)
        return replies

    @staticmethod
    def wait(replies: queue.Queue[NodeOutput], timeout: float = 10.0) -> list[NodeOutput]:
        outs = []
        while True:
            out = replies.get(timeout=timeout)
            outs.append(out)
            if out.final:
                return outs

    def tokens(self, outs: list[NodeOutput]) -> list[int]:
        return [int(self.store.get(o.outputs["token"])) for o in outs if "token" in o.outputs]

    def generate(self, request_id: str, prompt: list[int], n: int, stop=(), **kw) -> tuple[list[int], list[NodeOutput]]:
        """prefill call, then an engine-resident loop fed by the first token (as the Conductor does)."""
        first = self.wait(self.call(request_id, prompt, **kw))
        toks = self.tokens(first)
        if n == 1:
            return toks, first
        rest = self.wait(
            self.call(request_id, toks[-1:], loop=LoopSpec(max_iters=n - 1, stop_values=tuple(stop)), **kw)
        )
        return toks + self.tokens(rest), first + rest

    def until(self, pred, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out: {self.engine.stats()}"
            time.sleep(0.002)


@contextlib.contextmanager
def held_device_thread():
    """The device thread stays inside a call until the block ends: engines step only after it."""
    entered, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=run_on_device, args=(lambda: (entered.set(), release.wait()),))
    holder.start()
    entered.wait()
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_prefill_then_loop_equals_reference_with_finish_reasons_and_iterations():
    prompt = [3, 14, 15, 92, 65]
    with Harness() as h:
        toks, outs = h.generate("r", prompt, 10)
        assert toks == LM.reference_greedy(prompt, 10)
        prefill, loop = outs[0], outs[1:]
        assert prefill.final and prefill.finish_reason == "done" and prefill.iteration == 0
        assert [o.iteration for o in loop] == list(range(9))
        assert [o.final for o in loop] == [False] * 8 + [True]
        assert loop[-1].finish_reason == "length"
        assert all(o.finish_reason is None for o in loop[:-1])
        assert all(o.error is None for o in outs)
        # prompt + 9 fed-back tokens were computed; the 10th token was never fed back. The step
        # counts its tokens after sending its replies: wait for it, or this races a fast device thread
        h.until(lambda: h.engine.stats()["tokens_computed"] == len(prompt) + 9)
        h.engine.release("r")
        h.until(lambda: h.engine.stats()["sequences"] == 0)
        assert h.engine.blocks.num_used_blocks == 0
        assert len(h.store) == 0  # release frees the request's tensors on the engine thread


def test_loop_stop_value_ends_the_call_without_emitting_it():
    prompt = [7, 7, 1]
    ref = LM.reference_greedy(prompt, 12)
    k = next(i for i in range(2, 12) if ref[i] not in ref[:i])
    with Harness() as h:
        toks, outs = h.generate("r", prompt, 12, stop=(ref[k], 96))
        assert toks == ref[:k]
        assert outs[-1].final and outs[-1].finish_reason == "stop" and outs[-1].outputs == {}
        assert outs[-1].iteration == k - 1  # the stop token's iteration


def test_call_without_sampling_only_prefills():
    prompt = [1, 2, 3, 4, 5, 6]
    with Harness() as h:
        outs = h.wait(h.call("r", prompt[:-1], sampling=None))
        assert len(outs) == 1 and outs[0].final and outs[0].outputs == {} and outs[0].finish_reason == "done"
        assert h.engine.blocks.num_used_blocks == math.ceil(5 / 4)
        rest = h.wait(h.call("r", prompt[-1:], loop=LoopSpec(max_iters=6)))
        assert h.tokens(rest) == LM.reference_greedy(prompt, 6)


def test_concurrent_calls_are_batched_and_exact():
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (1, 9, 30, 4, 17, 2)]
    with Harness(max_batched_tokens=8, num_kv_blocks=20) as h:
        queues = [h.call(f"r{i}", p) for i, p in enumerate(prompts)]
        firsts = [h.tokens(h.wait(q)) for q in queues]
        loops = [h.call(f"r{i}", f, loop=LoopSpec(max_iters=7)) for i, f in enumerate(firsts)]
        for i, (p, f, q) in enumerate(zip(prompts, firsts, loops)):
            assert f + h.tokens(h.wait(q)) == LM.reference_greedy(p, 8), i
            # finished sequences stay IDLE (holding KV) until released; older idle holders are
            # not preempted for younger requests (see test_scheduler), so release as we go
            h.engine.release(f"r{i}")
        assert h.engine.stats()["preemptions"] > 0  # 31 blocks of work in a pool of 20
        h.until(lambda: h.engine.blocks.num_used_blocks == 0 and not h.engine.scheduler.seqs)


@pytest.mark.parametrize("case", ["unknown-node", "in-flight", "no-input", "vocab", "context", "pool"])
def test_admission_errors_then_the_engine_keeps_serving(case):
    lm = ToyLM(max_positions=40)
    with Harness(lm, num_kv_blocks=6) as h:
        if case == "unknown-node":
            outs, expect = h.wait(h.call("r", [1], node="other")), "not served by engine"
        elif case == "in-flight":
            with held_device_thread():  # both calls wait in the inbox: the loop cannot finish before the second
                h.call("r", [1, 2], loop=LoopSpec(max_iters=10))
                second = h.call("r", [3])
            outs, expect = h.wait(second), "already has a call in flight"
        elif case == "no-input":
            outs, expect = h.wait(h.call("r", None)), "no input tokens"
        elif case == "vocab":
            outs, expect = h.wait(h.call("r", [5, 97, 200])), "[97, 200] are outside the vocabulary [0, 97)"
        elif case == "context":
            outs, expect = h.wait(h.call("r", list(range(20)), loop=LoopSpec(max_iters=21))), "context limit of 40"
        else:
            outs, expect = h.wait(h.call("r", list(range(24)))), "needs 7 KV blocks, the pool has 6"
        assert len(outs) == 1 and outs[0].final
        assert outs[0].error is not None and expect in outs[0].error, outs[0].error
        assert outs[0].outputs == {}
        toks, _ = h.generate("ok", [4, 2], 5)
        assert toks == lm.reference_greedy([4, 2], 5)


def test_windowed_call_skips_the_context_check():
    lm = ToyLM(max_positions=512)
    with Harness(lm, num_kv_blocks=4) as h:
        # 200 tokens would need 50 blocks; with a window of 8 the call fits in 4
        peak = []
        q = h.call(
            "r",
            [1, 2, 3],
            loop=LoopSpec(max_iters=200),
            kv_window=8,
            on_reply=lambda out: peak.append(h.engine.blocks.num_used_blocks),
        )
        outs = h.wait(q)
        assert len(h.tokens(outs)) == 200 and outs[-1].finish_reason == "length"
        assert max(peak) <= math.ceil((8 + 4 - 1) / 4)
        seq = h.engine.scheduler.seqs[("r", "llm")]
        assert seq.table.first_position > 0
        assert seq.table.first_position + seq.table.num_tokens == 3 + 199
        assert 8 <= seq.table.num_tokens < 12
        # the window's first tokens equal the unwindowed model until eviction starts
        assert h.tokens(outs)[:5] == lm.reference_greedy([1, 2, 3], 5)


def test_release_of_a_session_call_keeps_its_kv_until_close_session():
    prompt = [10, 20, 30]
    with Harness() as h:
        toks, _ = h.generate("r1", prompt, 5, session_id="s")
        h.engine.release("r1")
        h.until(lambda: len(h.store) == 0)
        assert h.engine.blocks.num_used_blocks == math.ceil((3 + 4) / 4)
        seq = h.engine.scheduler.seqs[("s", "llm")]
        assert seq.token_ids == prompt + toks[:-1] and seq.num_computed == len(seq.token_ids)
        # the next message continues the same KV
        more, _ = h.generate("r2", [40], 4, session_id="s")
        assert more == LM.reference_greedy(prompt + toks[:-1] + [40], 4)
        h.engine.close_session("s")
        h.until(lambda: not h.engine.scheduler.seqs)
        h.engine.blocks.assert_all_free()


def test_release_mid_loop_drops_the_sequence_and_frees_its_blocks():
    with Harness() as h:
        q = h.call("r", [1, 2, 3], loop=LoopSpec(max_iters=200))
        first = q.get(timeout=10)
        assert not first.final
        h.engine.release("r")
        h.until(lambda: not h.engine.scheduler.seqs and h.engine.blocks.num_used_blocks == 0)
        h.until(lambda: len(h.store) == 0)
        steps = h.engine.stats()["steps"]
        time.sleep(0.05)
        assert h.engine.stats()["steps"] == steps  # nothing left to run


def test_release_of_a_session_mid_loop_keeps_only_computed_tokens():
    with Harness() as h:
        q = h.call("r", [1, 2, 3], loop=LoopSpec(max_iters=200), session_id="s")
        for _ in range(3):
            q.get(timeout=10)
        h.engine.release("r")
        h.until(lambda: h.engine.scheduler.seqs[("s", "llm")].call is None)
        seq = h.engine.scheduler.seqs[("s", "llm")]
        assert seq.num_pending == 0 and seq.table.num_tokens == len(seq.token_ids)
        assert h.engine.blocks.num_used_blocks == math.ceil(len(seq.token_ids) / 4)
        h.engine.close_session("s")
        h.until(lambda: h.engine.blocks.num_used_blocks == 0)


def test_same_seed_same_tokens_regardless_of_batch_mates():
    sampling = SamplingParams(temperature=1.2, top_p=0.9, seed=5)

    def sample(h, mates):
        for i in range(mates):
            h.call(
                f"m{i}",
                [i + 1] * (i + 2),
                loop=LoopSpec(max_iters=15),
                sampling=SamplingParams(temperature=0.8),
                seed=i,
            )
        toks, _ = h.generate("mine", [9, 8, 7], 15, sampling=sampling, seed=42)
        return toks

    with Harness() as h:
        alone = sample(h, 0)
    with Harness(max_batched_tokens=3) as h:
        crowded = sample(h, 5)
    with Harness() as h:
        other_seed, _ = h.generate("x", [9, 8, 7], 15, sampling=sampling, seed=43)
    assert alone == crowded
    assert alone != other_seed


class _FailsOn(ToyLM):
    def forward(self, input_ids, positions, attn):
        if bool((input_ids == 96).any()):
            raise RuntimeError("boom")
        return super().forward(input_ids, positions, attn)


def test_a_failing_step_fails_its_batch_and_the_engine_keeps_serving():
    lm = _FailsOn()
    with Harness(lm) as h:
        outs = h.wait(h.call("bad", [1, 96, 2]))
        assert outs[-1].final and "engine step failed" in outs[-1].error and "boom" in outs[-1].error
        h.until(lambda: h.engine.blocks.num_used_blocks == 0)  # its KV is freed (kept as tokens)...
        h.engine.release("bad")  # ...until the request is released
        h.until(lambda: not h.engine.scheduler.seqs)
        toks, _ = h.generate("good", [1, 2], 4)
        assert toks == lm.reference_greedy([1, 2], 4)


# ---- session preemption, driven step by step on the test thread (engine not started) ------------


class Stepper:
    """An AREngine whose messages and steps run on the calling thread: deterministic interleavings."""

    def __init__(self, **cfg) -> None:
        self.store = InProcessTensorStore()
        self.engine = AREngine(LM, ["llm"], self.store, EngineConfig(**{"num_kv_blocks": 32, "block_size": 4, **cfg}))
        self.outs: list[NodeOutput] = []
        self.ids = itertools.count()

    def call(self, request_id: str, ids: list[int], session_id: str | None = "s") -> None:
        msg = ExecuteNode(
            call_id=next(self.ids),
            request_id=request_id,
            node="llm",
            session_id=session_id,
            inputs={"input_ids": self.store.put(torch.tensor(ids), owner=request_id)},
            sampling=GREEDY,
        )
        self.engine._handle(msg, self.outs.append)

    def drain(self) -> int:
        while self.engine.scheduler.has_work():
            self.engine.step()
        out = self.outs[-1]
        assert out.final and out.error is None, out
        return int(self.store.get(out.outputs["token"]))

    def seq(self, session_id: str = "s"):
        return self.engine.scheduler.seqs[(session_id, "llm")]


P1, P2, P3 = [5, 6, 7, 8, 9], [10, 11], [12]


def test_preempted_session_is_recomputed_on_its_next_message():
    st = Stepper()
    st.call("r1", P1)
    st.drain()
    st.engine._handle(ReleaseRequest("r1"))
    st.engine.scheduler.preempt(st.seq())  # e.g. an older request needed the blocks
    assert st.seq().table.blocks == [] and st.seq().token_ids == P1
    st.call("r2", P2)
    assert st.drain() == LM.reference_greedy(P1 + P2, 1)[0]


def test_cancelling_a_preempted_session_message_keeps_the_session_history():
    """Known bug (see report): EngineCore.release_sequences truncates a session's tokens to
    ``num_computed``; after a preemption num_computed is 0, so cancelling the session's
    pending message also deletes the whole earlier history and the session silently
    continues from an empty context."""
    st = Stepper()
    st.call("r1", P1)
    st.drain()
    st.engine._handle(ReleaseRequest("r1"))
    st.call("r2", P2)  # the next message is queued ...
    st.engine.scheduler.preempt(st.seq())  # ... its session KV is preempted before it runs ...
    st.engine._handle(ReleaseRequest("r2"))  # ... and the message is cancelled
    assert st.seq().token_ids == P1, "the session lost its history"
    st.call("r3", P3)
    assert st.drain() == LM.reference_greedy(P1 + P3, 1)[0]


def _fed_call(h: Harness, request_id: str, prompt, iters: int) -> queue.Queue[NodeOutput]:
    replies: queue.Queue[NodeOutput] = queue.Queue()
    msg = ExecuteNode(
        call_id=next(h.ids),
        request_id=request_id,
        node="llm",
        inputs={"input_ids": h.store.put(torch.tensor(prompt), owner=request_id)},
        sampling=GREEDY,
        loop=LoopSpec(max_iters=iters),
        fed_inputs=("text",),
    )
    h.engine.submit(msg, replies.put)
    return replies


def _feed(h: Harness, request_id: str, rows: torch.Tensor | None, final: bool = False, port: str = "text") -> None:
    items = [] if rows is None else [h.store.put(rows, owner=request_id)]
    h.engine.feed(FeedInput(request_id, "llm", port, items, final))


def test_a_loop_waits_for_its_fed_rows_and_goes_on_as_they_come():
    from support.toy_models import FedLM

    lm = FedLM()
    with Harness(lm) as h:
        rows = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
        replies = _fed_call(h, "a", [5, 6, 7], 6)
        time.sleep(0.3)  # no row yet: its first sample would need row 1, so nothing is sampled
        assert replies.empty() and h.engine.stats()["feed_waits"] > 0
        _feed(h, "a", rows[:2])  # rows 0 and 1: one more token, then it waits for row 2
        first = replies.get(timeout=5)
        time.sleep(0.2)
        assert not first.final and replies.empty()
        _feed(h, "a", rows[2:])
        _feed(h, "a", None, final=True)  # the text ended: the end row, then nothing
        streamed = [first] + h.wait(replies)
        # the same rows given whole, as a closed stream, give the same tokens
        whole = _fed_call(h, "b", [5, 6, 7], 6)
        _feed(h, "b", rows, final=True)
        assert h.tokens(streamed) == h.tokens(h.wait(whole)) and len(h.tokens(streamed)) == 6


@pytest.mark.parametrize(
    "bad, error",
    [
        (torch.full((1, 32), float("nan")), "NaN or infinite"),
        (torch.zeros(1, 8), "8 wide, earlier ones 32"),
    ],
)
def test_bad_fed_rows_fail_that_call_and_the_engine_keeps_serving(bad, error):
    from support.toy_models import FedLM

    with Harness(FedLM()) as h:
        replies = _fed_call(h, "a", [5, 6, 7], 6)
        _feed(h, "a", torch.zeros(2, 32))
        _feed(h, "a", bad)
        outs = h.wait(replies)
        assert outs[-1].error is not None and error in outs[-1].error
        _feed(h, "gone", torch.zeros(1, 32))  # rows for a call that is not there: dropped
        other = _fed_call(h, "b", [1, 2], 3)
        _feed(h, "b", None, final=True)
        assert len(h.tokens(h.wait(other))) == 3
        h.until(lambda: h.engine.blocks.num_used_blocks == len(h.engine.scheduler.seqs["b", "llm"].table.blocks))


def test_rows_for_a_port_the_call_does_not_take_fed_fail_it():
    from support.toy_models import FedLM

    with Harness(FedLM()) as h:
        replies = _fed_call(h, "a", [5, 6, 7], 6)
        _feed(h, "a", torch.zeros(1, 32), port="other")
        assert "does not take as a fed input" in h.wait(replies)[-1].error
