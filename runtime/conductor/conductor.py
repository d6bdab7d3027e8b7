"""The Conductor: tracks each request's Walks, dispatches node calls to Workers, streams outputs.

Embedded default: one Worker in this process, tensors handed over in memory. The
Conductor speaks to Workers only in messages (ExecuteNode / NodeOutput /
ReleaseRequest / CloseSession) and tensor handles, through one worker set chosen when
it is built (``mstar.conductor.worker_set``), so Workers can move to other processes
without changing this file's logic.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from mstar.conductor.class_limits import ClassLimits, parse_class_limits
from mstar.conductor.inprocess_workers import InProcessWorkers
from mstar.conductor.process_workers import ProcessWorkers
from mstar.conductor.replies import ReplyInbox
from mstar.conductor.routing import Router
from mstar.conductor.stream_input import StreamInput, StreamInputError
from mstar.conductor.walk_executor import WalkExecutor
from mstar.conductor.worker_pool import WorkerPool
from mstar.conductor.worker_set import WorkerLink, WorkerSet
from mstar.conductor.worker_status import WorkerStatus
from mstar.engine.config import EngineConfig
from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, KVExported, NodeOutput, ReleaseRequest
from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT
from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.graph.request_state import RequestState
from mstar.placement.resolve import ResolvedPlacement, load_placement
from mstar.priority import UNCLASSED, Priority
from mstar.request import Request, RequestCancelled, RequestError, RequestStream, UnknownRequest
from mstar.worker.model_spec import build_model
from mstar.worker.protocol import ModelSpec

log = logging.getLogger("mstar.conductor")


class NodeError(RuntimeError):
    pass


def check_priorities(graph: ModelGraph, priorities: Mapping[str, Priority | str | int]) -> dict[str, Priority]:
    """Class overrides by node or walk name, checked against ``graph`` (ValueError names the bad entry)."""
    known = set(graph.node_by_name) | set(graph.walks)
    out: dict[str, Priority] = {}
    for name, value in priorities.items():
        if name not in known:
            raise ValueError(
                f"priorities: {name!r} is neither a node nor a walk of graph {graph.name!r} "
                f"(nodes {sorted(graph.node_by_name)}, walks {sorted(graph.walks)})"
            )
        out[name] = Priority.parse(value, f"priorities.{name}")
    return out


def _worker_set(
    graph: ModelGraph,
    modules: Mapping[str, NodeSubmodule] | None,
    config: EngineConfig | None,
    device: str | torch.device,
    pool: WorkerPool | None,
) -> WorkerSet:
    """The one place that tells the two apart: Worker processes when given their pool, else one in here."""
    if pool is not None:
        return ProcessWorkers(pool)
    if modules is None:
        raise ValueError("an embedded Conductor needs the graph's modules")
    return InProcessWorkers(graph, modules, config, device)


class Conductor:
    """Embedded (``Conductor(graph, modules)``: one in-process Worker) or distributed
    (``Conductor.distributed(spec, placement)``: one Worker process per rank).

    Priority classes (mstar.priority, docs/scheduling.md): each node call carries its request's
    class, unless ``priorities`` (node or walk name -> class; a placement's ``priorities:`` when
    distributed) names its node (first) or its current walk. ``class_limits``: in-flight limit per
    class (mstar.conductor.class_limits; a placement's ``class_limits:`` under them when distributed).
    With ``config.priority_classes`` False neither applies."""

    def __init__(
        self,
        graph: ModelGraph,
        modules: Mapping[str, NodeSubmodule] | None = None,
        *,
        config: EngineConfig | None = None,
        device: str | torch.device = "cpu",
        pool: WorkerPool | None = None,
        class_limits: Mapping[Priority | str | int, int] | None = None,
        priorities: Mapping[str, Priority | str | int] | None = None,
    ) -> None:
        self.graph = graph
        self.worker_set = _worker_set(graph, modules, config, device, pool)
        self.store = self.worker_set.store
        self.router = Router(graph, self.worker_set.placement, hosts=self.worker_set)
        self.priority_classes = (config or EngineConfig()).priority_classes
        placement = self.worker_set.placement
        overrides = {**(placement.priorities if placement is not None else {}), **(priorities or {})}
        limits = {**(placement.class_limits if placement is not None else {}), **parse_class_limits(class_limits)}
        self.class_limits = ClassLimits(limits if self.priority_classes else None)
        self.executor = WalkExecutor(
            graph,
            self._dispatch,
            itertools.count().__next__,
            priorities=check_priorities(graph, overrides) if self.priority_classes else None,
        )
        self._call_ids = itertools.count(1 << 40)  # KV hand-over calls, apart from the executor's ids
        self._kv_home: dict[tuple[str, str], int] = {}  # (KV owner, node) -> rank that holds its KV
        self._tasks: dict[str, asyncio.Task] = {}
        self._submissions = itertools.count()
        self._states: dict[str, RequestState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    @classmethod
    def distributed(
        cls,
        spec: ModelSpec,
        placement: str | Path | ResolvedPlacement,
        *,
        config: EngineConfig | None = None,
        class_limits: Mapping[Priority | str | int, int] | None = None,
        priorities: Mapping[str, Priority | str | int] | None = None,
        **pool_options,
    ) -> Conductor:
        """Workers in their own processes per the placement file (started here unless ``launch=False``);
        the placement's ``priorities:`` and ``class_limits:`` apply, those given here over them."""
        graph, _ = build_model(spec, set())
        resolved = placement if isinstance(placement, ResolvedPlacement) else load_placement(str(placement), graph)
        pool = WorkerPool(spec, resolved, config or EngineConfig(), **pool_options)
        return cls(graph, config=config, pool=pool, class_limits=class_limits, priorities=priorities)

    @property
    def pool(self) -> WorkerPool | None:
        """The Worker processes' pool of a distributed Conductor; None embedded."""
        return self.worker_set.pool

    @property
    def workers(self) -> list[WorkerLink]:
        return self.worker_set.workers

    def host_of(self, rank: int) -> str:
        return self.worker_set.host_of(rank)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> Conductor:
        self._loop = asyncio.get_running_loop()
        self._replies = ReplyInbox(self._loop)
        await self.worker_set.start()
        self.started = True
        return self

    async def stop(self) -> None:
        try:
            for request_id in list(self._tasks):
                if request_id in self._tasks:  # it may have ended while we cancelled another
                    await self.cancel(request_id)
        finally:
            await self.worker_set.stop()
            self.started = False

    async def __aenter__(self) -> Conductor:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- requests ----------------------------------------------------------------------
    def submit(self, request: Request) -> RequestStream:
        """Starts ``request``; returns an async iterator of its outputs. Bad inputs raise here."""
        if not self.started:
            raise RuntimeError("Conductor.submit before start()")
        if request.request_id in self._tasks:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        expected = set(self.graph.input_names)
        required = expected if self.graph.required_inputs is None else set(self.graph.required_inputs)
        missing = sorted(required - set(request.inputs))
        unknown = sorted(set(request.inputs) - expected)
        if missing or unknown:
            raise ValueError(
                f"request {request.request_id}: graph {self.graph.name!r} takes inputs {sorted(expected)}; "
                f"missing {missing}, unknown {unknown}"
            )
        request.priority = Priority.parse(request.priority, f"request {request.request_id}: priority")
        if request.outputs is not None and not set(request.outputs) <= set(self.graph.output_names):
            raise ValueError(
                f"request {request.request_id}: graph {self.graph.name!r} has outputs "
                f"{self.graph.output_names}, not {sorted(set(request.outputs) - set(self.graph.output_names))}"
            )
        seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(62)
        stream = RequestStream(request.request_id)
        rs = RequestState(
            request, seed, stream, self.store.get, wire_id=f"{request.request_id}#{next(self._submissions)}"
        )
        streamed = set(self.graph.stream_input_names)
        for name, tensor in request.inputs.items():
            if (name in streamed) != isinstance(tensor, StreamInput):
                kind = "a StreamInput (it arrives over time)" if name in streamed else "a tensor"
                raise TypeError(
                    f"request {request.request_id}: input {name!r} must be {kind}, got {type(tensor).__name__}"
                )
            if name in streamed:
                continue
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    f"request {request.request_id}: input {name!r} must be a tensor, got {type(tensor).__name__}"
                )
            handle = self.worker_set.put_input(tensor, owner=rs.wire_id)
            for edge in self.graph.edges_from(GRAPH_INPUT, name):
                if edge.target.node == GRAPH_OUTPUT:
                    continue
                rs.values[(edge.target.node, edge.target.port)] = handle
        self._states[request.request_id] = rs
        task = rs.main_task = asyncio.ensure_future(self._run(rs))
        task.add_done_callback(lambda _: self._cleanup(rs))  # also runs if cancelled before it started
        self._tasks[request.request_id] = task
        return stream

    async def cancel(self, request_id: str) -> None:
        """Stops the request and frees everything it held (KV blocks, queued calls, tensors)."""
        task = self._tasks.get(request_id)
        if task is None:
            raise UnknownRequest(request_id)
        rs = self._states.get(request_id)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        if rs is not None:
            self._cleanup(rs)  # now, not a callback later (idempotent)

    def close_session(self, session_id: str) -> None:
        """Frees the session's KV; a request of the session still running fails with a clear error."""
        for rs in list(self._states.values()):
            if rs.request.session_id == session_id and rs.main_task is not None and rs.failure is None:
                rs.failure = RequestError(rs.request_id, f"session {session_id!r} was closed")
                rs.main_task.cancel()
        for worker in self.workers:
            worker.handle(CloseSession(session_id))
        for key in [k for k in self._kv_home if k[0] == session_id]:
            del self._kv_home[key]

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def _run(self, rs: RequestState) -> None:
        """Waits for its class's turn (class_limits), then runs the request's Walks."""
        cls = rs.request.priority if self.priority_classes else UNCLASSED
        try:
            await self.class_limits.enter(cls)
        except asyncio.CancelledError:  # cancelled (or its session closed) while it waited
            self._cleanup(rs, notify=False)
            failure = rs.failure
            rs.stream.fail(
                failure if isinstance(failure, RequestError) else RequestCancelled(rs.request_id, "cancelled")
            )
            return
        try:
            await self._run_walks(rs)
        finally:
            self.class_limits.leave(cls)

    async def _run_walks(self, rs: RequestState) -> None:
        rid = rs.request_id
        outcome: RequestError | None = None
        rs.input_feeds = {
            name: asyncio.ensure_future(self._feed(rs, name, value))
            for name, value in rs.request.inputs.items()
            if isinstance(value, StreamInput)
        }
        feeds = list(rs.input_feeds.values())
        for feed in feeds:
            feed.add_done_callback(lambda task: self._feed_done(rs, task))
        try:
            while (walk := self.graph.next_walk(rs)) is not None:
                rs.current_walk = walk
                await self.executor.run(self.graph.walk(walk), rs)
                rs.walks_done.append(walk)
            rs.current_walk = None
            if feeds:
                await asyncio.gather(*feeds)
            await self.executor.close_streams(rs)
        except asyncio.CancelledError:
            failure = rs.failure  # a streamed chunk failed, or the session was closed
            if failure is None:
                outcome = RequestCancelled(rid, "cancelled")
            else:
                outcome = failure if isinstance(failure, RequestError) else RequestError(rid, str(failure))
        except RequestError as exc:
            outcome = exc
        except StreamInputError as exc:
            outcome = RequestError(rid, f"input stream failed: {exc}")
        except Exception as exc:
            log.warning("request %s failed: %s", rid, exc)
            outcome = RequestError(rid, f"{type(exc).__name__}: {exc}")
        finally:
            for feed in feeds:
                feed.cancel()
        self._cleanup(rs, notify=False)  # free everything before the caller hears the end
        if outcome is None:
            rs.stream.end()
        else:
            rs.stream.fail(outcome)

    async def _feed(self, rs: RequestState, name: str, source: StreamInput) -> None:
        """Items of a streamed input join its streaming edges as they arrive (the policy cuts chunks)."""
        async for tensor in source.items():
            handle = self.worker_set.put_input(tensor, owner=rs.wire_id)
            for edge in self.graph.edges_from(GRAPH_INPUT, name):
                self.executor.stream_append(rs, edge, handle)  # type: ignore[arg-type]

    @staticmethod
    def _feed_done(rs: RequestState, task: asyncio.Task) -> None:
        """A failed input stream fails its request now, not after the request's walks."""
        if task.cancelled() or task.exception() is None or rs.failure is not None:
            return
        rs.failure = RequestError(rs.request_id, f"input stream failed: {task.exception()}")
        if rs.main_task is not None:
            rs.main_task.cancel()

    def _cleanup(self, rs: RequestState, notify: bool = True) -> None:
        rid = rs.request_id
        if self._states.get(rid) is not rs:
            return
        del self._states[rid]
        if notify and not rs.stream.finished:  # cancelled before its task ever ran
            rs.stream.fail(RequestCancelled(rid, "cancelled"))
        for task in list(rs.chunk_tasks):
            task.cancel()
        for worker in self.workers:
            worker.handle(ReleaseRequest(rs.wire_id))
        for key in [k for k in self._kv_home if k[0] == rs.wire_id]:
            del self._kv_home[key]
        self.store.free_owner(rs.wire_id)
        self._tasks.pop(rid, None)

    # -- worker calls -----------------------------------------------------------------
    async def _dispatch(
        self, msg: ExecuteNode, on_output: Callable[[NodeOutput], None], on_sent: Callable[[object], None] | None = None
    ) -> None:
        """Sends one call to the node's worker; feeds each NodeOutput to ``on_output`` until final.
        ``on_sent(worker)`` runs right after the call went out (what follows it there goes after it).

        Outputs are handled in the event loop's reply drain itself (no queue, no coroutine
        switch per token); this coroutine only waits for the end of the call."""
        assert self._loop is not None
        rs = self._states.get(msg.request_id.rpartition("#")[0])
        walk = rs.current_walk if rs is not None else None
        rank = self.router.rank_for(msg.node, walk)
        worker = await self.worker_set.worker(rank)
        if self.router.distributed:
            msg.exports = self.router.exports(msg.node, rank, rs.request.outputs if rs is not None else None)
            if self.graph.node(msg.node).engine == "ar":
                await self._move_kv(msg, rank)
        done: asyncio.Future = self._loop.create_future()

        def deliver(out: NodeOutput) -> None:
            if done.done():  # the request was cancelled or already failed
                return
            if out.error is not None:
                done.set_exception(RequestError(msg.request_id.rpartition("#")[0], out.error))
                return
            try:
                on_output(out)
            except Exception as exc:
                done.set_exception(exc)
                return
            if out.final:
                done.set_result(None)

        replies = self._replies
        worker.execute(msg, lambda out: replies.push(deliver, out))
        if on_sent is not None:
            on_sent(worker)
        await done

    async def _move_kv(self, msg: ExecuteNode, rank: int) -> None:
        """The node's KV for this request lives on another rank (prefill there, decode here): move it."""
        owner = msg.session_id or msg.request_id
        home = self._kv_home.get((owner, msg.node))
        if home is None or home == rank:
            self._kv_home[(owner, msg.node)] = rank
            return
        source = await self.worker_set.worker(home)
        assert self._loop is not None
        moved: asyncio.Future = self._loop.create_future()
        export = ExportKV(next(self._call_ids), msg.request_id, owner, msg.node, self.router.kv_transport(home, rank))
        source.export_kv(
            export,
            lambda out: self._loop.call_soon_threadsafe(  # type: ignore[union-attr]
                lambda: moved.done() or moved.set_result(out)
            ),
        )
        result: KVExported = await moved
        if result.error is not None or result.state is None:
            raise RequestError(
                msg.request_id.rpartition("#")[0],
                f"moving the KV of node {msg.node!r} from rank {home} to rank {rank} failed: {result.error}",
            )
        msg.kv_import = result.state
        self._kv_home[(owner, msg.node)] = rank  # only now: a failed hand-over leaves the KV where it was

    # -- introspection (tests, /diagnostics) --------------------------------------------
    def stats(self) -> dict[str, object]:
        return {
            "in_flight": self.in_flight,
            "tensors_held": self._tensors_held(),
            "classes": self.class_limits.stats(),
            "workers": [w.stats() for w in self.workers],
        }

    def _tensors_held(self) -> int:
        return self.worker_set.tensors_held()

    def kv_blocks_used(self) -> int:
        return sum(w.kv_blocks_used() for w in self.workers)

    def worker_status(self) -> list[WorkerStatus]:
        """Each Worker by rank: alive / restarting / dead, restarts, last death, heartbeat age.
        Embedded, the one Worker is rank 0 in this very process (it cannot die on its own)."""
        return self.worker_set.worker_status()

    def dtype_summary(self) -> str:
        """What the Workers run and why: "bfloat16 (auto: native bf16 (avx512_bf16))", or per rank when
        they differ (each Worker decides ``dtype: auto`` for its own device)."""
        said = {s.rank: s.dtype_reason or s.dtype for s in self.worker_status() if s.dtype}
        if len(set(said.values())) == 1:
            return next(iter(said.values()))
        return "; ".join(f"rank {rank}: {what}" for rank, what in sorted(said.items())) or "not known yet"

    async def refresh(self) -> None:
        """Fetches the Worker processes' counters (stats(), kv_blocks_used() read the last ones)."""
        await self.worker_set.refresh()

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Waits until no request is in flight and the engines have processed their releases."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            await self.refresh()
            if not self._tasks and self.kv_blocks_used() == 0 and self._tensors_held() == 0:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"not idle after {timeout}s: {self.stats()}")
            await asyncio.sleep(0.01)
