"""Starts, watches and restarts the Worker processes of a placement.

The Conductor listens on a control address; each Worker (started here as
``python -m mstar.worker.process_main``, or by hand on another host with the same
arguments) connects, proves it holds the pool's token in its Hello and checks the
Conductor's proof back (``mstar.worker.handshake``), gets its Setup and answers Ready.
A Worker that dies is noticed when its connection drops (immediately for a killed
process) or when it stops answering heartbeats; its calls fail with the reason, its
shared memory is unlinked, and a fresh process takes its rank (a process that dies
while setting up is retried a few times). Launched Workers die with the Conductor's
process (PR_SET_PDEATHSIG); ``stop()`` leaves no process and no segment behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import msgspec

from mstar.conductor.connection_rejections import ConnectionRejections, RejectedConnection, rejection_for
from mstar.conductor.remote_worker import RemoteWorker
from mstar.conductor.worker_status import WorkerSetupError, WorkerStatus
from mstar.engine.config import EngineConfig
from mstar.placement.resolve import ResolvedPlacement
from mstar.transport.shm import segment_prefix, segments_with_prefix, unlink_segments
from mstar.worker import handshake
from mstar.worker.protocol import (
    HEADER_SIZE,
    MAX_FRAME,
    MAX_HELLO,
    TOKEN_ENV,
    Hello,
    ModelSpec,
    Ready,
    Setup,
    SetupFailed,
    Shutdown,
    TensorParallel,
    decode_body,
    encode_frame,
    frame_length,
    worker_tag,
)

log = logging.getLogger("mstar.conductor.workers")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the Conductor's process goes, even mid-setup
    (the Worker exits on it and unlinks its shared memory)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the Worker still exits when its connection drops


def describe_exit(code: int | None) -> str:
    if code is None:
        return "closed its connection"
    if code < 0:
        try:
            return f"died (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"died (signal {-code})"
    return f"exited with status {code}"


class WorkerPool:
    def __init__(
        self,
        spec: ModelSpec,
        placement: ResolvedPlacement,
        config: EngineConfig,
        *,
        launch: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int | None = None,
        transports: tuple[str, ...] = ("shm", "tcp"),
        setup_timeout: float = 180.0,
        restart: bool = True,
        heartbeat_s: float = 1.0,
        heartbeat_timeout_s: float = 5.0,
        setup_retries: int = 3,
        plugins: tuple[str, ...] = (),
        hello_timeout_s: float = 10.0,
    ) -> None:
        self.spec, self.placement, self.config = spec, placement, config
        self.launch, self.host, self.port = launch, host, port
        self.world_size = placement.world_size
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 1) // max(1, self.world_size))
        asked = placement.file.placement.transport
        if "mooncake" in {asked.default, *asked.edges.values()} and "mooncake" not in transports:
            transports = (*transports, "mooncake")  # only then: its engine is heavy to start
        self.transports = tuple(transports)
        self.setup_timeout = setup_timeout
        self.restart = restart
        self.heartbeat_s, self.heartbeat_timeout_s = heartbeat_s, heartbeat_timeout_s
        self.setup_retries = setup_retries
        self.hello_timeout_s = hello_timeout_s  # a connection that does not prove itself by then is closed
        self.rejections = ConnectionRejections(log)  # connections that were not Workers of this pool, by kind
        self.plugins = tuple(plugins)
        self.token = os.environ.get(TOKEN_ENV) or secrets.token_hex(16)
        self.workers: dict[int, RemoteWorker] = {}
        self._ready: dict[int, asyncio.Event] = {r: asyncio.Event() for r in range(self.world_size)}
        self._setup_errors: dict[int, str] = {}
        self._setup_crashes: dict[int, int] = {}
        self._processes: dict[int, subprocess.Popen] = {}
        self._ready_pids: set[int] = set()
        self._tp = self._tensor_parallel_groups()
        self._stopping = False
        self._started = False
        self._restarting: set[int] = set()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.restarts = 0
        self._rank_restarts: dict[int, int] = {}
        self._last_death: dict[int, str] = {}

    def _tensor_parallel_groups(self) -> dict[int, TensorParallel]:
        out: dict[int, TensorParallel] = {}
        for group in self.placement.file.placement.node_groups:
            if group.tp_size > 1 and group.ranks[0] not in out:
                init = f"tcp://{self.host}:{_free_port(self.host)}"
                for i, rank in enumerate(group.ranks):
                    out[rank] = TensorParallel(rank=i, size=group.tp_size, init_method=init)
        return out

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _task(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- start -------------------------------------------------------------------------
    async def listen(self) -> None:
        """Opens the control address (``address`` is known from here on); ``start`` does it if not done."""
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "conductor control address %s; %d worker(s)%s",
            self.address,
            self.world_size,
            "" if self.launch else f" expected to connect (with {TOKEN_ENV} set to this pool's token)",
        )

    async def start(self) -> None:
        if self._server is None:
            await self.listen()
        if self.launch:
            for rank in range(self.world_size):
                self._spawn(rank)
        await asyncio.gather(*(self.wait_ready(r, self.setup_timeout) for r in range(self.world_size)))
        self._started = True
        if self.heartbeat_s > 0:
            self._task(self._heartbeat())

    def _spawn(self, rank: int) -> None:
        if self._stopping:
            return
        cmd = [sys.executable, "-m", "mstar.worker.process_main", "--conductor", self.address, "--rank", str(rank)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # a local Worker imports what we can
        env[TOKEN_ENV] = self.token
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        self._processes[rank] = proc
        self._task(self._reap(rank, proc))
        log.info("started worker rank %d (pid %d)", rank, proc.pid)

    async def wait_ready(self, rank: int, timeout: float) -> RemoteWorker:
        """The rank's live Worker; waits while it starts (or is being restarted)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            worker = self.workers.get(rank)
            if self._ready[rank].is_set() and worker is not None and worker.alive:
                return worker
            if rank in self._setup_errors:
                raise WorkerSetupError(rank, self._setup_errors[rank])
            if self._stopping:
                raise RuntimeError(f"worker rank {rank} is stopped")
            if self._started and not (self.restart and self.launch) and worker is not None and not worker.alive:
                raise RuntimeError(f"{worker!r} {worker.death or 'is gone'} and is not restarted")
            if loop.time() > deadline:
                raise TimeoutError(
                    f"worker rank {rank} did not get ready within {timeout:.0f}s (control address {self.address})"
                )
            await asyncio.sleep(0.02)

    def _setup_for(self, rank: int) -> Setup:
        nodes = sorted({n for (n, _), p in self.placement.items() if rank in p.ranks})
        return Setup(
            spec=self.spec,
            nodes=nodes,
            config=self.config,
            device=self.placement.device_of(rank),
            threads=self.threads,
            transports=list(self.transports),
            host=self.host,
            tp=self._tp.get(rank),
            plugins=list(self.plugins),
            quantization=self.placement.quantization_on(rank),
        )

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """(hello, setup, reply) of a Worker of this pool; raises RejectedConnection saying why not."""
        challenge = handshake.challenge()
        writer.write(encode_frame(challenge))
        try:
            hello = await asyncio.wait_for(_read_frame(reader, MAX_HELLO), self.hello_timeout_s)
        except Exception as exc:
            raise rejection_for(exc, "Hello", self.hello_timeout_s) from None
        if not isinstance(hello, Hello) or not handshake.hello_is_valid(self.token, challenge, hello):
            raise RejectedConnection(
                "unproven",
                f"not a worker of this conductor (a {type(hello).__name__} without a valid proof of the pool token)",
            )
        rank = hello.rank
        if not 0 <= rank < self.world_size or (rank in self.workers and self.workers[rank].alive):
            raise RejectedConnection(
                "rank", f"rank {rank} is out of range (world size {self.world_size}) or already connected"
            )
        setup = self._setup_for(rank)
        writer.write(encode_frame(handshake.welcome(self.token, challenge, hello)) + encode_frame(setup))
        try:
            reply = await asyncio.wait_for(_read_frame(reader, MAX_FRAME), self.setup_timeout)
        except Exception as exc:
            rejected = rejection_for(exc, f"Ready (rank {rank}, pid {hello.pid})", self.setup_timeout)
            raise RejectedConnection("setup", rejected.reason) from None
        return hello, setup, reply

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._stopping:
                raise RejectedConnection("stopping", "the pool is stopping")
            hello, setup, reply = await self._handshake(reader, writer)
            if isinstance(reply, SetupFailed):
                self._setup_errors[hello.rank] = reply.error
                # while starting, start() raises it to the caller: saying it here too would say it twice
                (log.warning if self._started else log.debug)(
                    "worker rank %d failed to set up: %s", hello.rank, reply.error
                )
                writer.close()
                return
            if not isinstance(reply, Ready):
                raise RejectedConnection(
                    "setup", f"worker rank {hello.rank} answered its Setup with a {type(reply).__name__}, not Ready"
                )
        except Exception as exc:
            rejected = (
                exc
                if isinstance(exc, RejectedConnection)
                else RejectedConnection("error", f"{type(exc).__name__}: {exc}")
            )
            self.rejections.note(writer.get_extra_info("peername"), rejected)
            writer.close()
            return
        rank = hello.rank
        worker = RemoteWorker(
            rank, setup.nodes, reader, writer, hello.pid, hello.host, reply, self._processes.get(rank)
        )
        worker.explain_death = lambda w=worker: self._explain(w)
        worker.on_lost = self._on_lost
        self.workers[rank] = worker
        self._ready_pids.add(hello.pid)
        self._setup_crashes.pop(rank, None)
        worker.start()
        self._task(self._watch(worker))
        self._ready[rank].set()
        log.info(
            "worker rank %d ready (pid %d on %s): nodes %s, serves %s, runs %s",
            rank,
            hello.pid,
            hello.host,
            setup.nodes,
            sorted(reply.endpoints),
            worker.dtype or "?",
        )

    # -- failures ----------------------------------------------------------------------
    async def _explain(self, worker: RemoteWorker) -> str | None:
        proc = worker.process
        if proc is None:
            return None
        for _ in range(40):  # the exit status is there within a few ms of the socket closing
            if proc.poll() is not None:
                return describe_exit(proc.returncode)
            await asyncio.sleep(0.01)
        return None

    async def _reap(self, rank: int, proc: subprocess.Popen) -> None:
        """Every launched process ends here: its segments go; one that died before Ready is retried."""
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait)
        unlink_segments(segments_with_prefix(segment_prefix(worker_tag(self.token, rank, proc.pid))))
        if self._stopping or proc.pid in self._ready_pids or self._processes.get(rank) is not proc:
            return  # a ready Worker's death is handled by _watch
        if rank in self._setup_errors or not self.restart:
            self._setup_errors.setdefault(rank, f"the process {describe_exit(code)} during setup")
            return
        crashes = self._setup_crashes[rank] = self._setup_crashes.get(rank, 0) + 1
        if crashes > self.setup_retries:
            self._setup_errors[rank] = f"the process {describe_exit(code)} during setup, {crashes} times"
            return
        self._last_death[rank] = f"the process {describe_exit(code)} during setup"
        log.error(
            "worker rank %d (pid %d) %s during setup; retrying (%d of %d)",
            rank,
            proc.pid,
            describe_exit(code),
            crashes,
            self.setup_retries,
        )
        await asyncio.sleep(0.5 * crashes)
        self._spawn(rank)

    async def _heartbeat(self) -> None:
        """A Worker that is alive but does not answer (stopped, wedged) is treated as dead."""
        while not self._stopping:
            await asyncio.sleep(self.heartbeat_s)
            for worker in [w for w in self.workers.values() if w.alive]:
                self._task(self._probe(worker))

    async def _probe(self, worker: RemoteWorker) -> None:
        try:
            await worker.refresh_stats(self.heartbeat_timeout_s)
        except asyncio.TimeoutError:
            if worker.alive and not self._stopping:
                self._take_down(worker, f"stopped answering (no heartbeat reply within {self.heartbeat_timeout_s:g}s)")

    def _take_down(self, worker: RemoteWorker, reason: str) -> None:
        worker.mark_dead(reason)
        proc = worker.process
        if proc is not None and proc.poll() is None:
            proc.kill()

    def _tp_group_of(self, rank: int) -> list[int]:
        for group in self.placement.file.placement.node_groups:
            if group.tp_size > 1 and rank in group.ranks:
                return list(group.ranks)
        return [rank]

    def _on_lost(self, worker: RemoteWorker) -> None:
        """A tensor-parallel rank is gone: its group cannot step any more, so the others go too."""
        for r in self._tp_group_of(worker.rank):
            other = self.workers.get(r)
            if other is not None and other is not worker and other.alive:
                self._take_down(other, f"was taken down with its tensor-parallel group (rank {worker.rank} was lost)")

    async def _watch(self, worker: RemoteWorker) -> None:
        await worker.dead.wait()
        leaked = unlink_segments(segments_with_prefix(worker.segment_prefix))
        if self._stopping:
            return
        rank = worker.rank
        self._last_death[rank] = worker.death or "closed its connection"
        if rank in self._restarting or (worker.process is not None and self._processes.get(rank) is not worker.process):
            return  # its rank is being (or was) restarted with its tensor-parallel group
        log.error(
            "%r %s; %s", worker, worker.death, "restarting it" if self.restart and self.launch else "not restarting"
        )
        if leaked:
            log.info("unlinked %d shared-memory segment(s) the dead worker left", leaked)
        group = self._tp_group_of(rank)
        self._restarting.update(group)
        try:
            await self._restart_group(group)
        finally:
            self._restarting.difference_update(group)

    async def _restart_group(self, group: list[int]) -> None:
        for r in group:  # a tensor-parallel group lives and dies together
            self._ready[r].clear()
            proc = self._processes.get(r)
            if proc is not None and proc.poll() is None:
                proc.kill()  # a worker that dropped its connection (or lost its group) is not trusted
                await asyncio.get_running_loop().run_in_executor(None, proc.wait)
        if not (self.restart and self.launch) or self._stopping:
            return
        self.restarts += 1
        for r in group:
            self._rank_restarts[r] = self._rank_restarts.get(r, 0) + 1
        if len(group) > 1:  # a fresh rendezvous: the old one died with its leader
            init = f"tcp://{self.host}:{_free_port(self.host)}"
            for r in group:
                self._tp[r] = msgspec.structs.replace(self._tp[r], init_method=init)
        for r in group:
            self._spawn(r)

    # -- status ------------------------------------------------------------------------
    def worker_status(self) -> list[WorkerStatus]:
        """Every rank's state, process, restarts, last death and heartbeat age (for health reports)."""
        now = time.monotonic()
        out = []
        for rank in range(self.world_size):
            worker = self.workers.get(rank)
            proc = self._processes.get(rank)
            alive = worker is not None and worker.alive and self._ready[rank].is_set()
            if alive:
                state = "alive"
            elif (
                rank in self._setup_errors
                or self._stopping
                or (worker is not None and not (self.restart and self.launch))
            ):
                state = "dead"
            else:
                state = "starting" if worker is None else "restarting"
            pid = worker.pid if worker is not None and (alive or proc is None) else (proc.pid if proc else None)
            last_death = self._last_death.get(rank)
            if worker is not None and not worker.alive:  # its own account, once known (the exit status takes ms)
                last_death = worker.death or "lost its connection"
            out.append(
                WorkerStatus(
                    rank=rank,
                    state=state,
                    pid=pid,
                    host=worker.host if worker is not None else None,
                    nodes=tuple(sorted({n for (n, _), p in self.placement.items() if rank in p.ranks})),
                    restarts=self._rank_restarts.get(rank, 0),
                    last_death=last_death,
                    heartbeat_age_s=now - worker.last_heard if alive else None,
                    dtype=worker.dtype if worker is not None else None,
                    dtype_reason=worker.dtype_reason if worker is not None else None,
                )
            )
        return out

    # -- stop --------------------------------------------------------------------------
    async def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        for worker in list(self.workers.values()):
            if worker.death is None:
                worker.handle(Shutdown())  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        for rank, proc in list(self._processes.items()):
            try:
                await loop.run_in_executor(None, proc.wait, timeout)
            except subprocess.TimeoutExpired:
                log.warning("worker rank %d (pid %d) ignored shutdown; killing it", rank, proc.pid)
                proc.kill()
                await loop.run_in_executor(None, proc.wait)
        for worker in list(self.workers.values()):
            worker.stop()
            unlink_segments(segments_with_prefix(worker.segment_prefix))
        for rank, proc in self._processes.items():  # also those that never got ready
            unlink_segments(segments_with_prefix(segment_prefix(worker_tag(self.token, rank, proc.pid))))
        for task in list(self._tasks):
            task.cancel()
        self.rejections.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _read_frame(reader: asyncio.StreamReader, limit: int):
    return decode_body(await reader.readexactly(frame_length(await reader.readexactly(HEADER_SIZE), limit)))
