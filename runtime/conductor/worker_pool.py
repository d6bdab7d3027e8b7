"""Starts, watches and restarts the Worker processes of a placement.

The Conductor listens on a control address; each Worker (started here as
``python -m mstar.worker.process_main``, or by hand on another host with the same
arguments) connects, says Hello with its rank, gets its Setup and answers Ready.
A Worker that dies is noticed when its connection drops (immediately for a killed
process), its calls fail with the exit status, its shared memory is unlinked, and a
fresh process takes its rank. ``stop()`` leaves no process and no segment behind.
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

import msgspec

from mstar.conductor.remote_worker import RemoteWorker
from mstar.engine.config import EngineConfig
from mstar.placement.resolve import ResolvedPlacement
from mstar.transport.shm import segments_with_prefix, unlink_segments
from mstar.worker.protocol import (HEADER_SIZE, Hello, ModelSpec, Ready, Setup, SetupFailed, Shutdown,
                                   TensorParallel, decode_body, encode_frame, frame_length)

log = logging.getLogger("mstar.conductor.workers")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    def __init__(self, spec: ModelSpec, placement: ResolvedPlacement, config: EngineConfig, *,
                 launch: bool = True, host: str = "127.0.0.1", port: int = 0, threads: int | None = None,
                 transports: tuple[str, ...] = ("shm", "tcp"), setup_timeout: float = 180.0,
                 restart: bool = True) -> None:
        self.spec, self.placement, self.config = spec, placement, config
        self.launch, self.host, self.port = launch, host, port
        self.world_size = placement.world_size
        local = max(1, self.world_size)
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 1) // local)
        asked = placement.file.placement.transport
        if "mooncake" in {asked.default, *asked.edges.values()} and "mooncake" not in transports:
            transports = (*transports, "mooncake")  # only then: its engine is heavy to start
        self.transports = tuple(transports)
        self.setup_timeout = setup_timeout
        self.restart = restart
        self.token = os.environ.get("MSTAR_WORKER_TOKEN") or secrets.token_hex(4)
        self.workers: dict[int, RemoteWorker] = {}
        self._ready: dict[int, asyncio.Event] = {r: asyncio.Event() for r in range(self.world_size)}
        self._setup_errors: dict[int, str] = {}
        self._processes: dict[int, subprocess.Popen] = {}
        self._tp = self._tensor_parallel_groups()
        self._stopping = False
        self._started = False
        self._restarting: set[int] = set()
        self._server: asyncio.base_events.Server | None = None
        self.restarts = 0

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

    # -- start -------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("conductor control address %s; %d worker(s)%s", self.address, self.world_size,
                 "" if self.launch else " expected to connect")
        if self.launch:
            for rank in range(self.world_size):
                self._spawn(rank)
        await asyncio.gather(*(self.wait_ready(r, self.setup_timeout) for r in range(self.world_size)))
        self._started = True

    def _spawn(self, rank: int) -> None:
        cmd = [sys.executable, "-m", "mstar.worker.process_main", "--conductor", self.address,
               "--rank", str(rank), "--token", self.token]
        env = dict(os.environ)  # a local Worker imports what this process can import
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._processes[rank] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)
        log.info("started worker rank %d (pid %d)", rank, self._processes[rank].pid)

    async def wait_ready(self, rank: int, timeout: float) -> RemoteWorker:
        """The rank's live Worker; waits while it starts (or is being restarted)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            worker = self.workers.get(rank)
            if self._ready[rank].is_set() and worker is not None and worker.alive:
                return worker
            if rank in self._setup_errors:
                raise RuntimeError(f"worker rank {rank} failed to start: {self._setup_errors[rank]}")
            proc = self._processes.get(rank)
            if not self._started and proc is not None and proc.poll() is not None:
                raise RuntimeError(f"worker rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)} before it was ready")
            if self._stopping:
                raise RuntimeError(f"worker rank {rank} is stopped")
            if loop.time() > deadline:
                raise TimeoutError(f"worker rank {rank} did not get ready within {timeout:.0f}s "
                                   f"(control address {self.address})")
            await asyncio.sleep(0.02)

    def _setup_for(self, rank: int) -> Setup:
        nodes = sorted({n for (n, _), p in self.placement.items() if rank in p.ranks})
        return Setup(spec=self.spec, nodes=nodes, config=self.config, device=self.placement.device_of(rank),
                     threads=self.threads, transports=list(self.transports), host=self.host, tp=self._tp.get(rank))

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank = None
        try:
            hello = decode_body(await reader.readexactly(frame_length(await asyncio.wait_for(reader.readexactly(HEADER_SIZE), 10))))
            if not isinstance(hello, Hello) or hello.token != self.token:
                raise ValueError(f"not a worker of this conductor: {type(hello).__name__}")
            rank = hello.rank
            if not 0 <= rank < self.world_size or (rank in self.workers and self.workers[rank].alive):
                raise ValueError(f"rank {rank} is out of range or already connected")
            setup = self._setup_for(rank)
            writer.write(encode_frame(setup))
            reply = decode_body(await reader.readexactly(frame_length(
                await asyncio.wait_for(reader.readexactly(HEADER_SIZE), self.setup_timeout))))
        except Exception as exc:
            log.warning("rejected a worker connection%s: %s", f" (rank {rank})" if rank is not None else "", exc)
            writer.close()
            return
        if isinstance(reply, SetupFailed):
            self._setup_errors[rank] = reply.error
            log.error("worker rank %d failed to set up: %s", rank, reply.error)
            writer.close()
            return
        assert isinstance(reply, Ready)
        worker = RemoteWorker(rank, setup.nodes, reader, writer, hello.pid, hello.host, reply, self._processes.get(rank))
        worker.explain_death = lambda w=worker: self._explain(w)
        worker.on_lost = self._on_lost
        self.workers[rank] = worker
        worker.start()
        asyncio.ensure_future(self._watch(worker))
        self._ready[rank].set()
        log.info("worker rank %d ready (pid %d on %s): nodes %s, serves %s", rank, hello.pid, hello.host,
                 setup.nodes, sorted(reply.endpoints))

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

    def _tp_group_of(self, rank: int) -> list[int]:
        for group in self.placement.file.placement.node_groups:
            if group.tp_size > 1 and rank in group.ranks:
                return list(group.ranks)
        return [rank]

    def _on_lost(self, worker: RemoteWorker) -> None:
        """A tensor-parallel rank is gone: its group cannot step any more, so no new call may go to it."""
        for r in self._tp_group_of(worker.rank):
            other = self.workers.get(r)
            if other is not None and other is not worker:
                other.lost = True

    async def _watch(self, worker: RemoteWorker) -> None:
        await worker.dead.wait()
        leaked = unlink_segments(segments_with_prefix(worker.segment_prefix))
        if self._stopping:
            return
        rank = worker.rank
        if rank in self._restarting or (worker.process is not None and self._processes.get(rank) is not worker.process):
            return  # its rank is being (or was) restarted with its tensor-parallel group
        log.error("%r %s; %s", worker, worker.death, "restarting it" if self.restart and self.launch else "not restarting")
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
        if not (self.restart and self.launch):
            return
        self.restarts += 1
        if len(group) > 1:  # a fresh rendezvous: the old one died with its leader
            init = f"tcp://{self.host}:{_free_port(self.host)}"
            for r in group:
                self._tp[r] = msgspec.structs.replace(self._tp[r], init_method=init)
        for r in group:
            self._spawn(r)

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
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
