"""Control frames: a length is refused over the limit, and below it memory follows the bytes that arrive.

A loopback TCP connection carries real frames to a BlockingChannel (the Worker's end); the last test
plays an authenticated Conductor to a real Worker process and announces 1 GiB it never sends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from mstar.engine.messages import FeedInput
from mstar.transport.handle import TensorHandle
from mstar.worker.protocol import (
    MAX_FRAME,
    MAX_HELLO,
    TOKEN_ENV,
    BlockingChannel,
    FrameTooLarge,
    Shutdown,
    encode_frame,
)
from support.pool_peer import TOKEN, impostor_conductor


@pytest.fixture
def pair():
    """(the Worker's BlockingChannel, the Conductor's socket): a TCP connection on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conductor = socket.create_connection(listener.getsockname())
        channel = BlockingChannel(listener.accept()[0])
    yield channel, conductor
    channel.close()
    conductor.close()


def test_an_announced_frame_costs_only_the_bytes_that_arrive(pair):
    channel, conductor = pair
    announced = 256 << 20
    conductor.sendall(announced.to_bytes(4, "big") + b"abc")
    conductor.shutdown(socket.SHUT_WR)
    tracemalloc.start()
    with pytest.raises(ConnectionError, match=f"closed the connection after 3 of the {announced} bytes"):
        channel.recv()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20, peak  # was the whole announced length, zeroed, before a byte of it came


def test_a_frame_over_the_limit_is_refused_before_it_is_read(pair):
    channel, conductor = pair
    conductor.sendall((MAX_HELLO + 1).to_bytes(4, "big"))
    with pytest.raises(FrameTooLarge, match=f"{MAX_HELLO + 1} bytes was announced, over the {MAX_HELLO}-byte limit"):
        channel.recv(MAX_HELLO)
    conductor.sendall((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(FrameTooLarge):
        channel.recv()


def test_a_large_frame_arriving_in_pieces_decodes_whole_and_a_close_between_frames_is_none(pair):
    channel, conductor = pair
    item = TensorHandle("k/1/0", (3 << 20,), "uint8", data=bytes(range(256)) * (3 << 12))  # 3 MiB inline
    data = encode_frame(FeedInput("r1", "talker", "x", [item], final=True)) + encode_frame(Shutdown())

    def trickle() -> None:
        for i in range(0, len(data), 100_000):
            conductor.sendall(data[i : i + 100_000])
        conductor.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=trickle)
    sender.start()
    got = channel.recv()
    assert isinstance(got, FeedInput) and got.items[0].data == item.data and got.final
    assert isinstance(channel.recv(), Shutdown)
    assert channel.recv() is None
    sender.join(10)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_worker_does_not_allocate_a_frame_its_conductor_only_announces():
    announced = (1 << 30) - 1  # under MAX_FRAME: only its arrival may cost memory
    port, thread, got = impostor_conductor(None, announced.to_bytes(4, "big"), hold_s=3.0)
    env = {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "mstar.worker.process_main", "--conductor", f"127.0.0.1:{port}", "--rank", "1"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "hello" not in got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "hello" in got, "the Worker never said Hello"
        baseline = peak = _rss_kb(worker.pid)
        while thread.is_alive() and worker.poll() is None:
            peak = max(peak, _rss_kb(worker.pid))
            time.sleep(0.02)
        stderr = worker.communicate(timeout=30)[1]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert (peak - baseline) < 100 << 10, f"the Worker grew by {(peak - baseline) >> 10} MB"  # was +1024 MB
    assert worker.returncode == 2
    assert stderr.strip().endswith(
        f"the Conductor closed the connection after 0 of the {announced} bytes its frame announced"
    ), stderr
