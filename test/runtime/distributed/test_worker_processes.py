"""Workers in their own processes: same outputs as one process, over every transport; clean shutdown."""

from __future__ import annotations

import asyncio
import importlib.util
import os

import pytest

from mstar.conductor import Conductor, RequestError, WorkerSetupError
from mstar.placement import PlacementError
from mstar.transport.shm import segments_with_prefix
from mstar.worker.protocol import ModelSpec
from mstar.worker.registry import MODELS
from support.conductor_helpers import config, make_prompts, req, run
from support.toy_factory import REGISTRATION, toy_spec, toy_streaming

SPLIT = """
world_size: 2
node_groups:
  - {nodes: [llm], ranks: [0]}
  - {nodes: [sum], ranks: [1]}
transport: {default: TRANSPORT}
"""

PD = """
world_size: 2
node_groups:
  - {nodes: [llm], ranks: [0], walks: [prefill]}
  - {nodes: [llm], ranks: [1], walks: [decode]}
  - {nodes: [sum], ranks: [1]}
transport: {default: TRANSPORT}
"""


def placement(tmp_path, text: str, transport: str = "auto"):
    path = tmp_path / "placement.yaml"
    path.write_text(text.replace("TRANSPORT", transport))
    return path


async def collect(conductor: Conductor, request) -> dict[str, list]:
    out: dict[str, list] = {}
    async for item in conductor.submit(request):
        out.setdefault(item.name, []).append(item.data.tolist())
    return out


async def serve_all(conductor: Conductor, prompts, max_tokens: int = 12, outputs=None) -> list[dict]:
    return await asyncio.gather(
        *(collect(conductor, req(p, max_tokens, request_id=f"r{i}", outputs=outputs)) for i, p in enumerate(prompts))
    )


PROMPTS = make_prompts([3, 9, 5, 14], seed=3)


def embedded_outputs(outputs=None) -> list[dict]:
    async def go():
        graph, modules = toy_streaming({"llm", "sum"})
        async with Conductor(graph, modules, config=config()) as c:
            return await serve_all(c, PROMPTS, outputs=outputs)

    return run(go())


def assert_no_leftovers(conductor: Conductor) -> None:
    pool = conductor.pool
    for proc in pool._processes.values():
        assert proc.poll() is not None, f"worker pid {proc.pid} still running"
    for worker in pool.workers.values():
        assert segments_with_prefix(worker.segment_prefix) == []


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_two_processes_stream_what_one_process_streams(tmp_path, transport):
    expected = embedded_outputs(outputs=frozenset({"y", "n"}))

    async def go():
        c = Conductor.distributed(toy_spec(), placement(tmp_path, SPLIT, transport), config=config())
        async with c:
            got = await serve_all(c, PROMPTS, outputs=frozenset({"y", "n"}))
            await c.wait_idle(timeout=10)
            exports = c.router.exports("llm", 0, frozenset({"y", "n"}))
        return c, got, exports

    c, got, exports = run(go())
    assert exports == {"token": transport}  # tokens really crossed by that transport
    assert got == expected
    assert_no_leftovers(c)


def test_prefill_and_decode_on_different_ranks_match_one_rank(tmp_path):
    expected = embedded_outputs()

    async def go():
        c = Conductor.distributed(toy_spec(), placement(tmp_path, PD), config=config())
        async with c:
            got = await serve_all(c, PROMPTS)
            await c.wait_idle(timeout=10)
            stats = c.stats()["workers"]
        return c, got, stats

    c, got, stats = run(go())
    assert got == expected
    by_rank = {w.rank: w for w in c.pool.workers.values()}
    assert set(by_rank) == {0, 1}
    assert_no_leftovers(c)


def test_killed_worker_fails_its_request_fast_and_is_replaced(tmp_path):
    spec = toy_spec(delay=0.05)

    async def go():
        c = Conductor.distributed(spec, placement(tmp_path, SPLIT), config=config())
        async with c:
            victim = c.pool.workers[1]
            stream = c.submit(req(PROMPTS[1], 200, request_id="doomed", outputs=frozenset({"y"})))
            first = await stream.__anext__()
            assert first.name == "y"
            killed_at = asyncio.get_running_loop().time()
            os.kill(victim.pid, 9)
            with pytest.raises(RequestError) as info:
                async for _ in stream:
                    pass
            noticed = asyncio.get_running_loop().time() - killed_at
            after = await collect(c, req(PROMPTS[0], 8, request_id="next"))
            await c.wait_idle(timeout=10)
            assert c.pool.workers[1].pid != victim.pid
        return c, str(info.value), noticed, after, victim

    c, error, noticed, after, victim = run(go())
    assert noticed < 1.0, f"the failure took {noticed:.2f}s to reach the caller"
    assert "worker rank 1" in error and "SIGKILL" in error and "'sum'" in error, error
    assert len(after["token"]) == 8
    assert segments_with_prefix(victim.segment_prefix) == []
    assert_no_leftovers(c)


def _start_pool_with(tmp_path, spec, **options):
    """Starts Workers for ``spec`` over the toy graph (the Conductor itself builds nothing from it)."""
    from mstar.conductor.worker_pool import WorkerPool
    from mstar.placement import load_placement

    async def go():
        graph, _ = toy_streaming(set())
        pool = WorkerPool(
            spec, load_placement(str(placement(tmp_path, SPLIT)), graph), config(), setup_timeout=60, **options
        )
        c = Conductor(graph, config=config(), pool=pool)
        with pytest.raises(WorkerSetupError) as info:
            await c.start()
        await pool.stop()
        return pool, info.value

    return run(go())


def test_worker_that_cannot_build_its_model_fails_start_clearly(tmp_path):
    pool, error = _start_pool_with(tmp_path, toy_spec(no_such_argument=1))
    assert "TypeError" in error.error and "no_such_argument" in error.error, error
    assert all(p.poll() is not None for p in pool._processes.values())


@pytest.mark.slow
def test_a_setup_naming_an_unregistered_model_is_refused_and_nothing_named_is_imported(tmp_path, monkeypatch):
    """A Setup can name an importable module:function; the Worker imports nothing a message names."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_factory.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def build(nodes, **kw):\n    raise AssertionError('built')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # importable by the Workers too (they get our sys.path)
    assert importlib.util.find_spec("planted_factory") is not None  # importable, had anything tried
    for name in ("planted_factory:build", "not_registered"):
        pool, error = _start_pool_with(tmp_path, ModelSpec(name))
        assert isinstance(error, WorkerSetupError) and error.rank in (0, 1)
        assert error.error.startswith(f"NotRegistered: model {name!r} is not registered in this process"), error
        assert "toy_streaming" in error.error and "\n" not in error.error  # what is registered, in one line
        assert all(p.poll() is not None for p in pool._processes.values())
    assert not marker.exists(), "a Worker imported a module named by its Setup"


def test_a_setup_naming_an_unregistered_plugin_is_refused(tmp_path):
    _, error = _start_pool_with(tmp_path, toy_spec(), plugins=("no_such_plugin",))
    assert error.error.startswith("NotRegistered: Worker plugin 'no_such_plugin' is not registered"), error


def test_placement_naming_an_unknown_node_is_refused_before_any_process_starts(tmp_path):
    bad = placement(tmp_path, SPLIT.replace("[sum]", "[summ]"))
    with pytest.raises(PlacementError, match=r"placement.yaml:5: node_groups\[1\].nodes\[0\]: unknown node 'summ'"):
        Conductor.distributed(toy_spec(), bad, config=config())


def test_workers_started_by_hand_connect_to_the_conductor_address(tmp_path):
    """As on another host: the Conductor does not launch Workers; they connect to its address."""
    import subprocess
    import sys

    expected = embedded_outputs()

    async def go():
        c = Conductor.distributed(toy_spec(), placement(tmp_path, SPLIT), config=config(), launch=False)
        starting = asyncio.ensure_future(c.start())
        while c.pool.port == 0:
            await asyncio.sleep(0.01)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), MSTAR_WORKER_TOKEN=c.pool.token)
        del env[MODELS.env]  # registered by the flag below instead, as a user starting a Worker would
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mstar.worker.process_main",
                    "--conductor",
                    c.pool.address,
                    "--rank",
                    str(rank),
                    "--listen",
                    "127.0.0.1",
                    "--model",
                    REGISTRATION,
                ],
                env=env,
            )
            for rank in (1, 0)
        ]
        await starting
        try:
            got = await serve_all(c, PROMPTS)
        finally:
            await c.stop()
        codes = [await asyncio.get_running_loop().run_in_executor(None, p.wait, 10) for p in procs]
        return got, codes

    got, codes = run(go())
    assert got == expected
    assert codes == [0, 0]  # Shutdown ends them cleanly


def test_workers_exit_when_their_conductor_is_killed(tmp_path):
    """A Conductor that dies without stopping (SIGKILL) leaves no Worker and no segment behind."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "conductor.py"
    script.write_text(f"""
import asyncio, sys
sys.path[:0] = {[p for p in sys.path if p]!r}
from mstar.conductor import Conductor
from support.conductor_helpers import config
from support.toy_factory import toy_spec

async def main():
    c = Conductor.distributed(toy_spec(), {str(placement(tmp_path, SPLIT))!r}, config=config())
    await c.start()
    print(" ".join(f"{{w.pid}}:{{w.segment_prefix}}" for w in c.pool.workers.values()), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
""")
    conductor = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [item.split(":") for item in conductor.stdout.readline().split()]
        assert len(workers) == 2, workers
        conductor.send_signal(signal.SIGKILL)
        conductor.wait(10)
        deadline = time.monotonic() + 10
        alive = [pid for pid, _ in workers]
        while alive and time.monotonic() < deadline:
            alive = [
                pid
                for pid in alive
                if os.path.exists(f"/proc/{pid}")
                and "Z" not in open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
            ]
            time.sleep(0.05)
        assert alive == [], f"workers {alive} outlived their conductor"
        for _, prefix in workers:
            assert segments_with_prefix(prefix) == []
    finally:
        conductor.kill()


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_taken_down_and_replaced(tmp_path):
    import signal
    import time

    async def go():
        c = Conductor.distributed(
            toy_spec(delay=0.05), placement(tmp_path, SPLIT), config=config(), heartbeat_s=0.2, heartbeat_timeout_s=1.0
        )
        async with c:
            victim = c.pool.workers[1]
            stream = c.submit(req(PROMPTS[1], 200, request_id="stuck", outputs=frozenset({"y"})))
            await stream.__anext__()
            os.kill(victim.pid, signal.SIGSTOP)  # alive, but silent
            stopped = time.monotonic()
            with pytest.raises(RequestError) as info:
                async for _ in stream:
                    pass
            noticed = time.monotonic() - stopped
            after = await collect(c, req(PROMPTS[0], 8, request_id="next"))
        return str(info.value), noticed, after

    error, noticed, after = run(go())
    assert "stopped answering" in error, error
    assert noticed < 3.0, noticed
    assert len(after["token"]) == 8


@pytest.mark.slow
def test_each_worker_process_decides_its_dtype_and_says_so(tmp_path):
    """dtype auto is decided by each Worker for its own device and reported in its Ready: /diagnostics and
    the node sets' output say what every rank runs."""
    from mstar.engine.dtype_choice import resolve_dtype

    async def go(dtype: str):
        async with Conductor.distributed(toy_spec(), placement(tmp_path, SPLIT), config=config(dtype=dtype)) as c:
            return [(s.dtype, s.dtype_reason) for s in c.worker_status()], c.dtype_summary()

    here = resolve_dtype("auto")  # the Workers run on this machine: they decide as this process does
    assert run(go("auto")) == ([(here.dtype, here.describe())] * 2, here.describe())
    assert run(go("float32")) == ([("float32", "float32 (set explicitly)")] * 2, "float32 (set explicitly)")


@pytest.mark.slow
def test_worker_status_follows_a_killed_rank_through_its_restart(tmp_path):
    async def go():
        c = Conductor.distributed(toy_spec(), placement(tmp_path, SPLIT), config=config(), heartbeat_s=0.2)
        async with c:
            await asyncio.sleep(0.5)  # a few heartbeats
            before = c.worker_status()
            os.kill(before[1].pid, 9)
            seen = []
            deadline = asyncio.get_running_loop().time() + 60
            while not (any(snap[1].state != "alive" for snap in seen) and seen[-1][1].state == "alive"):
                assert asyncio.get_running_loop().time() < deadline, seen[-3:]
                seen.append(c.worker_status())
                await asyncio.sleep(0.02)
        return before, seen

    before, seen = run(go())
    assert [s.rank for s in before] == [0, 1] and all(s.state == "alive" for s in before)
    assert before[1].nodes == ("sum",) and before[1].restarts == 0 and before[1].last_death is None
    assert 0.0 <= before[1].heartbeat_age_s < 1.0
    down = [snap[1] for snap in seen if snap[1].state != "alive"]
    assert all(s.state == "restarting" and s.heartbeat_age_s is None for s in down), down
    # "lost its connection" for the few ms until the exit status is known, then the reason
    assert {s.last_death for s in down} <= {"lost its connection", "died (killed by SIGKILL)"}
    assert down[-1].last_death == "died (killed by SIGKILL)"
    back = seen[-1][1]
    assert back.state == "alive" and back.restarts == 1 and back.pid != before[1].pid
    assert back.last_death == "died (killed by SIGKILL)"
    assert all(snap[0].state == "alive" and snap[0].restarts == 0 for snap in seen)  # rank 0 was never touched
