"""Slots, overflow segments, cleanup (close, SIGKILL + supervisor), restarts and clear errors."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest
import torch

from mstar.transport.exchange import TensorExchange
from mstar.transport.handle import TensorHandle
from mstar.transport.shm import segments_with_prefix, unlink_segments

MIB = 1 << 20


def test_free_owner_releases_slots_and_they_are_reused(exchange, peer, tx):
    full = exchange.stats()["arena_free_bytes"]
    assert full == MIB
    first = [exchange.export(exchange.put(torch.randn(1000), "a"), "shm") for _ in range(3)]
    stats = exchange.stats()
    assert stats["arena_slots"] == 3 and stats["arena_free_bytes"] < full
    assert exchange.free_owner("a") == 3
    assert exchange.stats()["arena_slots"] == 0 and exchange.stats()["arena_free_bytes"] == full
    again = torch.randn(1000)
    reused = exchange.export(exchange.put(again, "b"), "shm")
    assert reused.offset == first[0].offset and reused.location == first[0].location
    tx.assert_same(peer.resolve(reused), again, "tensor in a reused slot")
    exchange.free_owner("b")


def test_tensor_bigger_than_free_space_gets_an_overflow_segment(exchange, peer, tx):
    fits = exchange.export(exchange.put(torch.zeros(600_000, dtype=torch.uint8), "fits"), "shm")
    assert fits.location == f"shm:{exchange.prefix}arena"
    big = torch.randint(0, 255, (700_000,), dtype=torch.uint8)  # fits the arena, not what is left of it
    exported = exchange.export(exchange.put(big, "big"), "shm")
    name = exported.location.removeprefix("shm:")
    assert name != f"{exchange.prefix}arena" and name.startswith(exchange.prefix)
    assert name in segments_with_prefix(exchange.prefix)
    tx.assert_same(peer.resolve(exported), big, "overflow segment")
    exchange.free_owner("big")
    assert name not in segments_with_prefix(exchange.prefix)
    assert exchange.stats()["arena_slots"] == 1  # the arena slot of "fits" is untouched
    exchange.free_owner("fits")


def test_close_unlinks_every_segment_it_created():
    ex = TensorExchange(f"close{os.getpid()}", shm=True, tcp_host="127.0.0.1", shm_arena_mb=1)
    ex.export(ex.put(torch.zeros(2 * MIB, dtype=torch.uint8), "r"), "shm")  # arena + overflow
    assert len(segments_with_prefix(ex.prefix)) == 2
    ex.close()
    assert segments_with_prefix(ex.prefix) == []
    ex.close()  # idempotent


def test_peer_close_leaves_nothing_in_dev_shm(new_peer):
    p = new_peer()
    p.put_export(torch.zeros(2 * MIB, dtype=torch.uint8), "r", "shm")
    assert len(segments_with_prefix(p.prefix)) == 2
    p.call("close")
    p.proc.wait(30)
    assert segments_with_prefix(p.prefix) == []


def test_supervisor_unlinks_segments_of_a_sigkilled_process(new_peer):
    p = new_peer()
    p.put_export(torch.zeros(2 * MIB, dtype=torch.uint8), "r", "shm")
    os.kill(p.pid, signal.SIGKILL)
    p.proc.wait(30)
    left = segments_with_prefix(p.prefix)
    assert len(left) == 2  # nobody ran close(): the segments outlive the process
    assert unlink_segments(left) == 2
    assert segments_with_prefix(p.prefix) == []


def test_reader_notices_a_restarted_peer_with_the_same_tag(exchange, new_peer, tx):
    first = new_peer()
    old = first.put_export(torch.zeros(100), "r", "shm")
    tx.assert_same(exchange.get(old), torch.zeros(100), "first incarnation")  # maps and caches the arena
    first.close()
    second = new_peer(tag=first.tag)
    new = second.put_export(torch.ones(100), "r", "shm")
    assert (new.location, new.offset) == (old.location, old.offset)
    tx.assert_same(exchange.get(new), torch.ones(100), "same segment name, new process")


def test_tcp_read_of_a_freed_or_unknown_key_names_the_key(exchange, peer, tx):
    handle = exchange.export(exchange.put(torch.ones(3), "gone"), "tcp")
    exchange.free_owner("gone")
    with pytest.raises(tx.PeerError) as err:
        peer.resolve(handle)
    assert err.value.kind == "KeyError" and handle.key in err.value.message
    unknown = TensorHandle("nobody/x/1", (3,), "float32", handle.location, nbytes=12)
    with pytest.raises(tx.PeerError, match="nobody/x/1"):
        peer.resolve(unknown)
    live = exchange.export(exchange.put(torch.arange(3.0), "live"), "tcp")
    tx.assert_same(peer.resolve(live), torch.arange(3.0), "same connection after an error")
    exchange.free_owner("live")


def test_unknown_location_scheme_is_a_clear_error(exchange):
    handle = TensorHandle("elsewhere/r/1", (2,), "float32", "pigeon:coop-7", nbytes=8)
    with pytest.raises(ValueError, match="unknown location scheme 'pigeon'"):
        exchange.get(handle)


def test_inproc_handle_of_another_process_is_a_clear_error(exchange, peer):
    handle = TensorHandle(f"{peer.tag}/r/1", (2,), "float32", "inproc")
    with pytest.raises(KeyError, match="readable only in the process that made it"):
        exchange.get(handle)


def test_export_errors_say_what_is_missing():
    ex = TensorExchange(f"bare{os.getpid()}")
    h = ex.put(torch.ones(2), "r")
    for kind, needs in (("shm", "shm=False"), ("tcp", "tcp_host"), ("mooncake", "mooncake_host")):
        with pytest.raises(RuntimeError, match=needs):
            ex.export(h, kind)
    with pytest.raises(ValueError, match="unknown export kind"):
        ex.export(h, "carrier")
    with pytest.raises(KeyError, match="only its producer can export it"):
        ex.export(TensorHandle("other/r/1", (2,), "float32"), "inline")
    with pytest.raises(ValueError, match="process tag"):
        TensorExchange("no/slashes")
    assert ex.endpoints() == {}
    ex.close()


def test_missing_mooncake_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake", None)  # import mooncake now fails as if not installed
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    tag = f"nomc{os.getpid()}"
    with pytest.raises(ImportError, match=r"mstar_ros\[mooncake\]"):
        TensorExchange(tag, shm=True, mooncake_host="127.0.0.1", shm_arena_mb=1)
    assert segments_with_prefix(f"mstar-{tag}.") == []  # the failed constructor cleaned up its arena


def test_concurrent_put_export_read_free_from_several_threads(exchange, tx):
    reader = TensorExchange(f"reader{os.getpid()}", shm_arena_mb=1)
    failures: list[str] = []

    def worker(n: int) -> None:
        try:
            for i in range(40):
                owner = f"t{n}-{i}"
                t = torch.full((n * 100 + i + 1,), float(i))
                for kind in ("shm", "tcp", "inline"):
                    got = reader.get(exchange.export(exchange.put(t, owner), kind))
                    if not torch.equal(got, t):
                        failures.append(f"{owner} {kind}")
                exchange.free_owner(owner)
        except Exception as exc:  # surfaced by the assert below
            failures.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    reader.close()
    assert failures == []
    assert exchange.stats()["arena_free_bytes"] == MIB and len(exchange) == 0
