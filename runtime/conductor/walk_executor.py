"""Runs one request's Walk tree: Sequential, Parallel, Loop / DynamicLoop, AwaitInput, and streaming edges.

Values move along edges as tensor handles; only stop checks and graph outputs
look at tensor contents. A Loop whose body is one AR node fed by its own output
is handed to the engine whole (engine-resident loop); any other Loop is iterated here.
A streaming edge into a node's fed input passes its chunks to that node's running call
(FeedInput) instead of starting a call per chunk; it closes when its producer's call ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mstar.engine.messages import ExecuteNode, FeedInput, LoopSpec, NodeOutput
from mstar.graph.chunk_policies import Chunk
from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT, StreamingGraphEdge
from mstar.graph.model_graph import ModelGraph
from mstar.graph.request_state import RequestState, StreamState
from mstar.graph.walks import AwaitInput, Call, Loop, Parallel, Sequential, StopOnValues, StopWhen, WalkStep
from mstar.priority import UNCLASSED, Priority
from mstar.request import RequestError, RequestOutput
from mstar.transport.handle import TensorHandle, TensorRef

# (call, its outputs' handler, what to do right after the call went to its Worker: given the Worker)
Dispatch = Callable[[ExecuteNode, Callable[[NodeOutput], None], Callable[[Any], None] | None], Awaitable[None]]


_CALL_FIELDS = frozenset({"mask", "mask_arg", "kv_window", "kv_from"})  # request meta read into ExecuteNode fields


class _StopWatch:
    def __init__(self, edge: str, values: tuple[int, ...]) -> None:
        self.edge, self.values, self.fired = edge, set(values), False


class WalkExecutor:
    def __init__(
        self,
        graph: ModelGraph,
        dispatch: Dispatch,
        new_call_id: Callable[[], int],
        priorities: Mapping[str, Priority] | None = None,
    ) -> None:
        """``priorities``: class overrides by node or walk name (a node's first); None: priority classes
        are off, and every call goes out as ``UNCLASSED`` whatever its request's class."""
        self.graph = graph
        self.dispatch = dispatch
        self.new_call_id = new_call_id
        self.priorities = priorities
        self._nodes_of_walk: dict[str, frozenset[str]] = {}

    async def run(self, step: WalkStep, rs: RequestState, watches: tuple[_StopWatch, ...] = ()) -> None:
        if any(w.fired for w in watches):
            return  # an enclosing loop's stop value appeared: the rest of its body does not run
        if isinstance(step, Call):
            await self._call(step.node, rs, watches)
        elif isinstance(step, Sequential):
            for child in step.steps:
                await self.run(child, rs, watches)
        elif isinstance(step, Parallel):
            await self._parallel(step, rs, watches)
        elif isinstance(step, Loop):
            await self._loop(step, rs, watches)
        elif isinstance(step, AwaitInput):
            await self._await_input(step.name, rs)
        else:
            raise TypeError(f"unknown walk step {step!r}")

    async def _parallel(self, step: Parallel, rs: RequestState, watches: tuple[_StopWatch, ...]) -> None:
        """All branches at once; the first to fail cancels the others (none is left running on its own)."""
        tasks = [asyncio.ensure_future(self.run(b, rs, watches)) for b in step.branches]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            pending = [t for t in tasks if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    # -- loops -----------------------------------------------------------------------
    async def _loop(self, loop: Loop, rs: RequestState, watches: tuple[_StopWatch, ...]) -> None:
        limit = loop.trip_limit(rs)
        if limit == 0:
            return
        if self.graph.engine_resident(loop):
            stop = loop.stop.values if isinstance(loop.stop, StopOnValues) else ()
            await self._call(loop.body.node, rs, watches, LoopSpec(max_iters=limit, stop_values=tuple(stop)))  # type: ignore[attr-defined]
            return
        watch = _StopWatch(loop.stop.edge, loop.stop.values) if isinstance(loop.stop, StopOnValues) else None
        inner = watches + ((watch,) if watch else ())
        iteration = 0
        while limit is None or iteration < limit:
            await self.run(loop.body, rs, inner)
            iteration += 1
            if any(w.fired for w in inner):
                break
            if isinstance(loop.stop, StopWhen) and loop.stop.predicate(rs):
                break

    # -- one node call -----------------------------------------------------------------
    def call_priority(self, node: str, rs: RequestState) -> Priority:
        """The class ``node``'s call of ``rs`` runs in: an override for the node, then for the current
        walk, else the request's own."""
        if self.priorities is None:
            return UNCLASSED
        for name in (node, rs.current_walk):
            if name is not None and name in self.priorities:
                return self.priorities[name]
        return Priority(rs.request.priority)

    def _inputs(self, node: str, rs: RequestState) -> dict[str, TensorRef]:
        inputs = {}
        for port in self.graph.node(node).inputs:
            ref = rs.values.get((node, port))
            if ref is not None:
                inputs[port] = ref
        return inputs

    def _message(
        self,
        node: str,
        rs: RequestState,
        inputs: dict[str, TensorRef],
        loop: LoopSpec | None = None,
        meta: dict[str, int] | None = None,
    ) -> ExecuteNode:
        gnode = self.graph.node(node)
        req = rs.request
        walk_nodes = self._walk_nodes(rs.current_walk)
        # request meta "node.key" (an int, not one of the fields below) reaches that node's calls
        prefix = f"{node}."
        node_meta = {
            k[len(prefix) :]: int(v)
            for k, v in req.meta.items()
            if k.startswith(prefix) and k[len(prefix) :] not in _CALL_FIELDS and isinstance(v, (int, bool))
        }
        return ExecuteNode(
            call_id=self.new_call_id(),
            request_id=rs.wire_id,
            node=node,
            inputs=inputs,
            index=rs.next_index(node),
            seed=rs.seed,
            # request meta "node.sampling" (a SamplingParams) samples that node otherwise than the request
            sampling=req.meta.get(f"{node}.sampling", req.sampling)
            if gnode.engine == "ar" and "token" in gnode.outputs
            else None,
            loop=loop,
            session_id=req.session_id,
            meta={**node_meta, **(meta or {})},
            mask=int(req.meta.get(f"{node}.mask", 0)),
            mask_arg=int(req.meta.get(f"{node}.mask_arg", 0)),
            kv_window=req.meta.get(f"{node}.kv_window"),
            kv_from=self._kv_from(node, rs),
            guidance=gnode.guidance,
            loop_mode=gnode.loop_mode,
            step_rows=any(self._step_streams(node, walk_nodes)),
            priority=self.call_priority(node, rs),
        )

    def _kv_from(self, node: str, rs: RequestState) -> str | None:
        """The view ``node``'s new sequence forks: request meta ``"<node>.kv_from"`` (a request whose
        context for ``node`` continues another view's, e.g. a prompt after a shared image prefix, sends
        only its own rows), else the node's ``kv_from``. The fork happens only when the call starts the
        node's sequence; the view must be an AR view of the same module, on the same Worker."""
        gnode = self.graph.node(node)
        key = f"{node}.kv_from"
        view = rs.request.meta.get(key)
        if view is None:
            return gnode.kv_from
        source = self.graph.node_by_name.get(view) if isinstance(view, str) else None
        if source is None or source is gnode or source.engine != "ar" or source.module_name != gnode.module_name:
            raise RequestError(
                rs.request_id,
                f"request meta {key!r} = {view!r} must name another AR view of node {node!r}'s module "
                f"{gnode.module_name!r}",
            )
        return view

    def _walk_nodes(self, walk: str | None) -> frozenset[str]:
        """The nodes a walk calls (cached: every call of a node asks)."""
        if walk is None:
            return frozenset()
        nodes = self._nodes_of_walk.get(walk)
        if nodes is None:
            nodes = self._nodes_of_walk[walk] = frozenset(self.graph.walk(walk).node_names())
        return nodes

    def _step_streams(self, node: str, walk_nodes: frozenset[str]) -> list[StreamingGraphEdge]:
        """The streaming edges from ``node``'s step rows into a node of the current walk."""
        return [
            e
            for port in self.graph.node(node).outputs
            if port.startswith("step_")
            for e in self.graph.edges_from(node, port)
            if isinstance(e, StreamingGraphEdge) and e.target.node in walk_nodes
        ]

    async def _call(
        self, node: str, rs: RequestState, watches: tuple[_StopWatch, ...] = (), loop: LoopSpec | None = None
    ) -> None:
        inputs = self._inputs(node, rs)
        fed = {
            e.target.port: self._stream(rs, e)
            for e in self.graph.edges_into(node)  # type: ignore[arg-type]
            if e.target.port in self.graph.node(node).fed_inputs
        }
        walk_nodes = self._walk_nodes(rs.current_walk)
        for port, state in fed.items():  # what has come so far goes with the call
            if state.edge.source.node not in walk_nodes:  # no producer runs beside it: nothing more comes
                self._close(rs, state)
            if state.fed:
                inputs[port], state.fed = list(state.fed), []
        missing = [p for p in self.graph.node(node).inputs if p not in inputs and self._required(node, p)]
        if missing:
            raise RequestError(
                rs.request_id, f"walk {rs.current_walk!r}: node {node!r} has no value for input(s) {missing}"
            )
        msg = self._message(node, rs, inputs, loop)
        msg.fed_inputs = tuple(fed)  # a stream already closed: its end follows at once (the engine's rows one shape)
        for port in inputs:  # a value is consumed by the call it feeds, unless the request's input is
            if port not in fed and not self._request_constant(
                node, port
            ):  # its only source (a Loop body reads it every time)
                rs.values.pop((node, port), None)

        def sent(worker) -> None:  # from now on the rest goes to the running call, in order after it
            for port, state in fed.items():
                state.feed_open, state.sink = True, self._sink(worker, msg, port)
                if state.fed or state.closed:
                    items, state.fed = state.fed, []
                    state.sink(items, state.closed)
                    state.feed_open = not state.closed

        try:
            await self.dispatch(msg, lambda out: self.propagate(rs, node, out.outputs, watches), sent if fed else None)
        finally:
            for state in fed.values():  # the call is over: later rows are not needed
                state.sink, state.feed_open = (lambda items, final: None), False
        if msg.step_rows:  # the producer's call ended: its streams of step rows end with it
            for edge in self._step_streams(node, walk_nodes):
                self._close(rs, self._stream(rs, edge))

    @staticmethod
    def _sink(worker, msg: ExecuteNode, port: str) -> Callable[[list[TensorHandle], bool], None]:
        def send(items: list[TensorHandle], final: bool) -> None:
            worker.handle(FeedInput(msg.request_id, msg.node, port, list(items), final, msg.session_id))

        return send

    def _request_constant(self, node: str, port: str) -> bool:
        sources = [e for e in self.graph.edges_into(node) if e.target.port == port]
        return bool(sources) and all(
            e.source.node == GRAPH_INPUT and not isinstance(e, StreamingGraphEdge) for e in sources
        )

    def _required(self, node: str, port: str) -> bool:
        if port in self.graph.node(node).optional_inputs:
            return False
        return not any(isinstance(e, StreamingGraphEdge) for e in self.graph.edges_into(node) if e.target.port == port)

    # -- moving values along edges ------------------------------------------------------
    def propagate(
        self, rs: RequestState, node: str, outputs: dict[str, TensorHandle], watches: tuple[_StopWatch, ...] = ()
    ) -> None:
        for port, handle in outputs.items():
            endpoint = f"{node}.{port}"
            fired = [w for w in watches if w.edge == endpoint and int(rs.fetch(handle).reshape(-1)[0]) in w.values]
            if fired:
                for w in fired:
                    w.fired = True
                continue  # the stopping value is not passed on
            rs.produced[endpoint] = handle
            for edge in self.graph.edges_from(node, port):
                if isinstance(edge, StreamingGraphEdge):
                    self.stream_append(rs, edge, handle)
                elif edge.target.node == GRAPH_OUTPUT:
                    self._emit(rs, edge.target.port, handle)
                else:
                    rs.values[(edge.target.node, edge.target.port)] = handle

    def _emit(self, rs: RequestState, name: str, handle: TensorHandle) -> None:
        wanted = rs.request.outputs
        if wanted is not None and name not in wanted:
            return
        index = rs.output_counts.get(name, 0)
        rs.output_counts[name] = index + 1
        rs.stream.put(RequestOutput(rs.request_id, name, rs.fetch(handle), index))

    # -- streaming edges ----------------------------------------------------------------
    def _stream(self, rs: RequestState, edge: StreamingGraphEdge) -> StreamState:
        key = str(edge)
        state = rs.streams.get(key)
        if state is None:
            topo = self.graph.topology
            assert topo is not None  # validated at declaration
            source = topo.partition_of(edge.source.node)
            policy = topo.policy(source, edge.target_partition)  # type: ignore[arg-type]
            state = rs.streams[key] = StreamState(edge, policy)  # type: ignore[arg-type]
        return state

    def stream_append(self, rs: RequestState, edge: StreamingGraphEdge, handle: TensorHandle) -> None:
        state = self._stream(rs, edge)
        state.items.append(handle)
        self._pump(rs, state)

    def _pump(self, rs: RequestState, state: StreamState) -> None:
        for chunk in state.policy.ready(state.cursor, len(state.items), state.closed):
            state.cursor = chunk.end
            self._send(rs, state, chunk)

    def _send(self, rs: RequestState, state: StreamState, chunk: Chunk) -> None:
        edge = state.edge
        if edge.target.node != GRAPH_OUTPUT and edge.target.port in self.graph.node(edge.target.node).fed_inputs:
            items = state.items[chunk.start + chunk.left_context : chunk.end]
            if state.sink is not None:
                state.sink(items, False)
            else:  # its call is not sent yet
                state.fed.extend(items)
            return
        previous = state.last_delivery
        state.last_delivery = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._deliver_chunk(rs, state, chunk, previous, state.last_delivery))
        rs.chunk_tasks.add(task)
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)
        task.add_done_callback(lambda t: self._chunk_done(rs, t))

    @staticmethod
    def _chunk_done(rs: RequestState, task: asyncio.Task) -> None:
        """A failed chunk fails its request: a hole in the audio must not pass silently."""
        rs.chunk_tasks.discard(task)
        if task.cancelled() or task.exception() is None or rs.failure is not None:
            return
        rs.failure = task.exception()
        if rs.main_task is not None:
            rs.main_task.cancel()

    async def _deliver_chunk(
        self, rs: RequestState, state: StreamState, chunk: Chunk, previous: asyncio.Future | None, done: asyncio.Future
    ) -> None:
        edge = state.edge
        items, left_context = state.items[chunk.start : chunk.end], chunk.left_context
        try:
            if edge.target.node == GRAPH_OUTPUT:
                if previous is not None:
                    await previous
                for handle in items[left_context:]:
                    self._emit(rs, edge.target.port, handle)
                return
            node = edge.target.node
            inputs = self._inputs(node, rs)
            inputs[edge.target.port] = list(items)
            msg = self._message(
                node,
                rs,
                inputs,
                meta={"left_context": left_context, "first": int(chunk.first), "final": int(chunk.final)},
            )
            results: list[NodeOutput] = []
            await self.dispatch(msg, results.append)
            if previous is not None:
                await previous
            for out in results:
                self.propagate(rs, node, out.outputs)
        finally:
            if not done.done():
                done.set_result(None)

    def _close(self, rs: RequestState, state: StreamState) -> None:
        """The stream's producer is done: the policy sends what it held back, and its final chunk."""
        if state.closed:
            return
        state.closed = True
        self._pump(rs, state)
        last = state.policy.final(state.cursor, len(state.items))
        if last is not None:
            self._send(rs, state, last)
        if state.sink is not None and state.feed_open:  # the running call hears that no more rows come
            state.sink([], True)
            state.feed_open = False

    async def _await_input(self, name: str, rs: RequestState) -> None:
        """AwaitInput: the streamed input ends; its streams, then the streams their consumers feed, are
        closed in turn and their chunks run, so every value they lead to is in place."""
        feed = rs.input_feeds.get(name)
        if feed is None:
            raise RequestError(
                rs.request_id,
                f"walk {rs.current_walk!r} waits for the streamed input {name!r}, which this request does not stream",
            )
        await feed  # a failed input stream raises here
        pending = [e for e in self.graph.edges_from(GRAPH_INPUT, name) if isinstance(e, StreamingGraphEdge)]
        done: set[str] = set()
        while pending:
            edge = pending.pop(0)
            if str(edge) in done:
                continue
            done.add(str(edge))
            state = self._stream(rs, edge)
            if not state.items:
                raise RequestError(rs.request_id, f"the streamed input {name!r} ended with nothing on {edge}")
            self._close(rs, state)
            if state.tasks:
                await asyncio.gather(*list(state.tasks))  # a failed chunk raises here
            if edge.target.node != GRAPH_OUTPUT:
                pending += [e for e in self.graph.streaming_edges() if e.source.node == edge.target.node]

    async def close_streams(self, rs: RequestState) -> None:
        """The producers are done: flush what the policies hold back, wait for every chunk."""
        for state in list(rs.streams.values()):
            self._close(rs, state)
        while rs.chunk_tasks:
            await asyncio.gather(*list(rs.chunk_tasks))
