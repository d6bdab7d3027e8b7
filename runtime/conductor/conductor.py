"""The Conductor: tracks each request's Walks, dispatches node calls to Workers, streams outputs.

Embedded default: one Worker in this process, tensors handed over in memory. The
Conductor speaks to Workers only in messages (ExecuteNode / NodeOutput /
ReleaseRequest / CloseSession) and tensor handles, so Workers can move to other
processes without changing this file's logic.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from typing import Callable, Mapping

import torch

from mstar.conductor.replies import ReplyInbox
from mstar.conductor.request import Request, RequestCancelled, RequestError, RequestStream, UnknownRequest
from mstar.conductor.state import RequestState
from mstar.conductor.walk_executor import WalkExecutor
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT
from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.transport.inprocess import InProcessTensorStore
from mstar.worker.messages import CloseSession, ExecuteNode, NodeOutput, ReleaseRequest
from mstar.worker.worker import Worker

log = logging.getLogger("mstar.conductor")


class NodeError(RuntimeError):
    pass


class Conductor:
    def __init__(self, graph: ModelGraph, modules: Mapping[str, NodeSubmodule], *,
                 config: EngineConfig | None = None, device: str | torch.device = "cpu") -> None:
        self.graph = graph
        self.store = InProcessTensorStore()
        # built on the device thread: dtype casts and KV allocation are heavy torch work
        self.workers = [run_on_device(Worker, graph, modules, self.store, config, device)]
        self._route = {node: w for w in self.workers for node in w.nodes}
        missing = [n.name for n in graph.nodes if n.name not in self._route]
        if missing:
            raise ValueError(f"nodes {missing} are placed on no worker")
        self.executor = WalkExecutor(graph, self._dispatch, itertools.count().__next__)
        self._tasks: dict[str, asyncio.Task] = {}
        self._submissions = itertools.count()
        self._states: dict[str, RequestState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = False

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> "Conductor":
        self._loop = asyncio.get_running_loop()
        self._replies = ReplyInbox(self._loop)
        for worker in self.workers:
            worker.start()
        self.started = True
        return self

    async def stop(self) -> None:
        try:
            for request_id in list(self._tasks):
                if request_id in self._tasks:  # it may have ended while we cancelled another
                    await self.cancel(request_id)
        finally:
            for worker in self.workers:
                worker.stop()
            self.started = False

    async def __aenter__(self) -> "Conductor":
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
        missing = sorted(expected - set(request.inputs))
        unknown = sorted(set(request.inputs) - expected)
        if missing or unknown:
            raise ValueError(f"request {request.request_id}: graph {self.graph.name!r} takes inputs {sorted(expected)}; "
                             f"missing {missing}, unknown {unknown}")
        if request.outputs is not None and not set(request.outputs) <= set(self.graph.output_names):
            raise ValueError(f"request {request.request_id}: graph {self.graph.name!r} has outputs "
                             f"{self.graph.output_names}, not {sorted(set(request.outputs) - set(self.graph.output_names))}")
        seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(62)
        stream = RequestStream(request.request_id)
        rs = RequestState(request, seed, stream, self.store.get, wire_id=f"{request.request_id}#{next(self._submissions)}")
        for name, tensor in request.inputs.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"request {request.request_id}: input {name!r} must be a tensor, got {type(tensor).__name__}")
            handle = self.store.put(tensor, owner=rs.wire_id)
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

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def _run(self, rs: RequestState) -> None:
        rid = rs.request_id
        outcome: RequestError | None = None
        try:
            while (walk := self.graph.next_walk(rs)) is not None:
                rs.current_walk = walk
                await self.executor.run(self.graph.walk(walk), rs)
                rs.walks_done.append(walk)
            rs.current_walk = None
            await self.executor.close_streams(rs)
        except asyncio.CancelledError:
            failure = rs.failure  # a streamed chunk failed, or the session was closed
            if failure is None:
                outcome = RequestCancelled(rid, "cancelled")
            else:
                outcome = failure if isinstance(failure, RequestError) else RequestError(rid, str(failure))
        except RequestError as exc:
            outcome = exc
        except Exception as exc:
            log.warning("request %s failed: %s", rid, exc)
            outcome = RequestError(rid, f"{type(exc).__name__}: {exc}")
        self._cleanup(rs, notify=False)  # free everything before the caller hears the end
        if outcome is None:
            rs.stream.end()
        else:
            rs.stream.fail(outcome)

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
        self.store.free_owner(rs.wire_id)
        self._tasks.pop(rid, None)

    # -- worker calls -----------------------------------------------------------------
    async def _dispatch(self, msg: ExecuteNode, on_output: Callable[[NodeOutput], None]) -> None:
        """Sends one call to the node's worker; feeds each NodeOutput to ``on_output`` until final.

        Outputs are handled in the event loop's reply drain itself (no queue, no coroutine
        switch per token); this coroutine only waits for the end of the call."""
        assert self._loop is not None
        done: asyncio.Future = self._loop.create_future()

        def deliver(out: NodeOutput) -> None:
            if done.done():  # the request was cancelled or already failed
                return
            if out.error is not None:
                done.set_exception(RequestError(msg.request_id.partition("#")[0], out.error))
                return
            try:
                on_output(out)
            except Exception as exc:
                done.set_exception(exc)
                return
            if out.final:
                done.set_result(None)

        replies = self._replies
        self._route[msg.node].execute(msg, lambda out: replies.push(deliver, out))
        await done

    # -- introspection (tests, /diagnostics) --------------------------------------------
    def stats(self) -> dict[str, object]:
        return {"in_flight": self.in_flight, "tensors_held": len(self.store),
                "workers": [w.stats() for w in self.workers]}

    def kv_blocks_used(self) -> int:
        return sum(w.kv_blocks_used() for w in self.workers)

    async def wait_idle(self, timeout: float = 5.0) -> None:
        """Waits until no request is in flight and the engines have processed their releases."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._tasks or self.kv_blocks_used() > 0 or len(self.store) > 0:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"not idle after {timeout}s: {self.stats()}")
            await asyncio.sleep(0.01)
