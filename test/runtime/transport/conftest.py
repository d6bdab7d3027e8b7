"""Fixtures for the transport tests: real peer processes, exchanges, generated tensors.

Every peer is a separate Python process (peer_process.py) talking to the test over
127.0.0.1; tags include our pid so concurrent test runs never share /dev/shm names.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import secrets
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Listener
from pathlib import Path

import msgspec
import pytest
import torch

from mstar.transport.exchange import TensorExchange
from mstar.transport.handle import TensorHandle
from mstar.transport.shm import segment_prefix, segments_with_prefix, unlink_segments
from mstar.transport.tcp import SECRET_ENV

PEER_SCRIPT = Path(__file__).with_name("peer_process.py")
_spec = importlib.util.spec_from_file_location("transport_peer_process", PEER_SCRIPT)
wire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wire)  # to_wire / from_wire, shared with the peer
HAVE_MOONCAKE = importlib.util.find_spec("mooncake") is not None
_tags = itertools.count()


# this process and the peers it starts (they inherit the environment) share one tensor-server secret
os.environ.setdefault(SECRET_ENV, secrets.token_hex(16))


def new_tag(name: str) -> str:
    return f"{name}{os.getpid()}x{next(_tags)}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mooncake: needs the mooncake extra (make test installs it; never skipped)")


def require_mooncake() -> None:
    # Mooncake tests must run in CI: a missing package fails here, loudly, instead of skipping.
    assert HAVE_MOONCAKE, "mooncake-transfer-engine-non-cuda is not installed: pip install -e '.[mooncake]'"


def make_cases() -> list[tuple[str, torch.Tensor]]:
    """Every dtype the runtime moves, in shapes from 0-d and empty to multi-dimensional."""
    gen = torch.Generator().manual_seed(1234)
    makers = {
        "float32": lambda s: torch.randn(s, generator=gen),
        "bfloat16": lambda s: torch.randn(s, generator=gen).to(torch.bfloat16),
        "int64": lambda s: torch.randint(-(2**40), 2**40, s, generator=gen),
        "bool": lambda s: torch.rand(s, generator=gen) > 0.5,
    }
    cases = []
    for name, make in makers.items():
        for shape in [(), (0,), (2, 0, 3), (7,), (3, 4, 5), (96, 65)]:
            cases.append((f"{name}{list(shape)}", make(shape)))
        cases.append((f"{name}-transposed", make((5, 9)).t()))  # not contiguous: export copies it
    return cases


class PeerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


class Peer:
    """A TensorExchange in another process (shm arena 1 MiB, tcp, mooncake when installed)."""

    def __init__(self, tag: str | None = None, mooncake: bool = HAVE_MOONCAKE) -> None:
        self.tag = tag or new_tag("peer")
        self.prefix = segment_prefix(self.tag)
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        self._log = tempfile.TemporaryFile()
        env = {**os.environ, "PEER_MOONCAKE": "1" if mooncake else "0"}
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER_SCRIPT), str(listener.address[1]), authkey.hex(), self.tag],
            env=env,
            stdout=self._log,
            stderr=self._log,
        )
        accepted: list = []
        thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
        thread.start()
        while thread.is_alive() and self.proc.poll() is None:
            thread.join(0.1)
        thread.join(120)
        listener.close()
        if not accepted:
            raise RuntimeError(f"peer process failed to start:\n{self.log()}")
        self.conn = accepted[0]
        _, self.pid, self.endpoints = self._recv()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def _recv(self, timeout: float = 60):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"peer {self.tag} did not answer within {timeout}s:\n{self.log()}")
        return self.conn.recv()

    def call(self, cmd: str, *args):
        self.conn.send((cmd, *args))
        status, *reply = self._recv()
        if status == "error":
            raise PeerError(*reply)
        return reply[0]

    def put_export(self, tensor: torch.Tensor, owner: str, kind: str) -> TensorHandle:
        return msgspec.msgpack.decode(self.call("put_export", wire.to_wire(tensor), owner, kind), type=TensorHandle)

    def resolve(self, handle: TensorHandle) -> torch.Tensor:
        return wire.from_wire(self.call("resolve", msgspec.msgpack.encode(handle)))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("close")
            except (OSError, EOFError, TimeoutError):
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        unlink_segments(segments_with_prefix(self.prefix))  # whatever a failed test left
        self._log.close()


@pytest.fixture(scope="module")
def peer():
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def new_peer():
    """Peers a test may close or kill itself; all are cleaned up after it."""
    made: list[Peer] = []

    def start(tag: str | None = None, mooncake: bool = False) -> Peer:
        made.append(Peer(tag, mooncake=mooncake))
        return made[-1]

    yield start
    for p in made:
        p.close()


@pytest.fixture
def exchange():
    """This process's exchange: shm (1 MiB arena) and a tcp server."""
    ex = TensorExchange(new_tag("test"), shm=True, tcp_host="127.0.0.1", shm_arena_mb=1)
    yield ex
    ex.close()
    assert segments_with_prefix(ex.prefix) == []


@pytest.fixture(scope="module")
def mooncake_exchange():
    require_mooncake()
    ex = TensorExchange(new_tag("mc"), shm=True, tcp_host="127.0.0.1", mooncake_host="127.0.0.1", shm_arena_mb=1)
    yield ex
    ex.close()


@pytest.fixture
def cases() -> list[tuple[str, torch.Tensor]]:
    return make_cases()


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: values differ"


@pytest.fixture(scope="session")
def tx():
    """Helpers for the test modules (conftest cannot be imported under --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(
        assert_same=assert_same, PeerError=PeerError, require_mooncake=require_mooncake, new_tag=new_tag, wire=wire
    )
