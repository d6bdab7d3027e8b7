"""``mstar-ros bench mixed``: the robots' control latency on an edge box that also speaks and makes images.

The models run as the edge host runs them (mstar_ros.edge, config/edge.yaml): pi0.5 and the voice model
in this process, one Conductor each, every engine stepping on its one device thread (pi0.5's nodes of
class control, the voice model's interactive: mstar_ros.edge.classes); the batch image job in a process
of its own under SCHED_IDLE (mstar_ros.bench.batch_process). In one run:

1. alone: ``robots`` robots offer observations at ``hz`` each and ask for a chunk every
   ``chunk_period`` seconds (when they reach their refill point; 0: as soon as the last one returned;
   the policy node's fresh-frame rule; pi0.5's sensor-to-action latency from the synthetic bag,
   mstar_ros.bench.pi05_loads), nothing else running; then the voice peers alone (their RTF unloaded);
2. loaded: the same robots while ``peers`` voice peers speak one answer after another
   (mstar_ros.bench.mixed_loads) and the batch process makes images back to back;
3. one process: the same with the image model in this process too (its steps on the same device thread,
   class batch);
4. classes off: as 3 with ``EngineConfig(priority_classes=False)`` (first come, first served).

Figures: ``control_p95_ratio`` = loaded p95 / alone p95 (goal <= 1.25), the share of chunks later than
the robot's refill point (``refill_at`` actions left at ``control_rate_hz``: the robot would run out
of actions before the next chunk; goal < 1%), the voice RTF (goal < 1 where it was < 1 alone), and
where the chunks' time went on the device (mstar_ros.bench.mixed_timeline).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from mstar.engine.device_loop import device_thread
from mstar.engine.step_trace import StepTrace
from mstar_ros.bench.batch_process import BatchProcess
from mstar_ros.bench.mixed_loads import images_until, speak_until
from mstar_ros.bench.mixed_timeline import chunk_breakdown
from mstar_ros.bench.pi05_loads import ours_open, request_for
from mstar_ros.bench.workload import percentile


def chunk_period_s(policy) -> float:
    """Seconds between a robot's chunk requests when it asks at its refill point: the actions it runs
    from a chunk before then (the horizon less ``refill_at``) at ``control_rate_hz``."""
    from mstar_ros.ros.pi05.params import PARAMETERS

    refill_at = PARAMETERS["refill_at"][0] or policy.action_horizon // 2
    return (policy.action_horizon - refill_at) / PARAMETERS["control_rate_hz"][0]


def refill_deadline_s(policy) -> float:
    """Seconds from a chunk's request to the robot running out of the actions it had left: ``refill_at``
    (default half the horizon) at ``control_rate_hz`` (config/pi05.yaml's defaults)."""
    from mstar_ros.ros.pi05.params import PARAMETERS

    refill_at = PARAMETERS["refill_at"][0] or policy.action_horizon // 2
    return refill_at / PARAMETERS["control_rate_hz"][0]


@contextlib.asynccontextmanager
async def conductors(models: dict, dtype: str, classes: bool, configs: dict | None = None):
    """One Conductor per front-end (pi05 / voice / images), entered together; each request carries its
    front-end's class (pi0.5 chunks control, voice interactive, images batch), as on the edge box.
    ``configs``: a front-end's EngineConfig (its dtype and classes set from ``dtype`` and ``classes``)."""
    import msgspec

    from mstar.engine.config import EngineConfig
    from mstar_ros.edge.classes import classed_conductor

    def config(role: str) -> EngineConfig:
        base = (configs or {}).get(role) or EngineConfig()
        return msgspec.structs.replace(base, dtype=dtype, priority_classes=classes)

    async with contextlib.AsyncExitStack() as stack:
        yield {
            role: await stack.enter_async_context(classed_conductor(model.graph(), model.modules(), config(role)))
            for role, model in models.items()
        }


async def _for(seconds: float, work) -> list:
    """Runs ``work(stop)`` for ``seconds``, then stops it; what it returned."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(work(stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


async def _warm(models: dict, running: dict, observation, args) -> None:
    """One of each first: first calls are slow (allocation, packing)."""
    import msgspec

    await running["pi05"].submit(request_for(models["pi05"], observation)).collect()
    speech = models["voice"].request("Hello there.", request_id="warm-voice")
    speech.sampling = msgspec.structs.replace(speech.sampling, max_tokens=args.max_tokens, seed=0)
    await running["voice"].submit(speech).collect()
    image = models["images"]
    async for _event in image.generate_images(
        running["images"],
        prompt="warm",
        images=[],
        size=image.image_size(None, []),
        n=1,
        seed=0,
        steps=args.image_steps,
        request_id="warm-image",
    ):
        pass


@contextlib.contextmanager
def traced():
    """The device thread records its steps inside the block (and stops, whatever happens)."""
    device = device_thread()
    device.trace = trace = StepTrace()
    try:
        yield trace
    finally:
        device.trace = None


async def _batch_elsewhere(batch: BatchProcess, stop: asyncio.Event) -> list[float]:
    """The batch process makes images until ``stop``; the seconds of those it finished."""
    batch.start()
    await stop.wait()
    return await asyncio.get_running_loop().run_in_executor(None, batch.finish)


async def measure(
    models: dict, observations, args, bar, *, classes: bool, alone: bool, batch: BatchProcess | None = None
) -> dict:
    """One pass: (alone figures if ``alone``, then) the loaded figures, with classes on or off; the batch
    job in this process, or in ``batch`` (a process of its own, as the edge box's batch group)."""
    policy = models["pi05"]
    fresh = 1.0 / args.hz
    period = chunk_period_s(policy) if args.chunk_period is None else args.chunk_period
    out: dict = {}
    async with conductors(models, args.dtype, classes, {"voice": voice_engine_config(args)}) as running:
        await _warm(models, running, observations[0][0], args)
        if alone:
            with traced() as trace:
                run = await ours_open(
                    policy, running["pi05"], observations, args.seconds, bar, fresh, chunk_period_s=period
                )
            out["alone"] = {"control": run.latencies, "where": chunk_breakdown(run.spans, trace, classes)}
            out["alone"]["voice_rtf"] = await _for(
                args.voice_seconds,
                lambda stop: speak_until(
                    models["voice"], running["voice"], args.peers, stop, args.max_tokens, bar, args.voice_pause
                ),
            )
        stop = asyncio.Event()
        voice = asyncio.ensure_future(
            speak_until(models["voice"], running["voice"], args.peers, stop, args.max_tokens, bar, args.voice_pause)
        )
        images = asyncio.ensure_future(
            images_until(models["images"], running["images"], stop, args.image_steps, bar)
            if batch is None
            else _batch_elsewhere(batch, stop)
        )
        await asyncio.sleep(0.5)  # the voice and batch work under way before the robots start
        with traced() as trace:
            run = await ours_open(
                policy, running["pi05"], observations, args.seconds, bar, fresh, chunk_period_s=period
            )
        stop.set()
        where = chunk_breakdown(run.spans, trace, classes)
        out["loaded"] = {"control": run.latencies, "voice_rtf": await voice, "image_s": await images, "where": where}
        out["voice_forward_compiled"] = forward_compiled(running["voice"])
    return out


def forward_compiled(conductor) -> bool:
    """Whether an AR engine of ``conductor`` serves with its forward compiled (what ran, not what was asked)."""
    return any(
        isinstance(engine, dict) and bool(engine.get("forward_compiled"))
        for worker in conductor.stats()["workers"]
        for engine in worker.values()
    )


def _control(latencies: list[float], deadline_s: float) -> dict:
    late = sum(1 for x in latencies if x > deadline_s)
    return {
        "chunks": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 50), 1) if latencies else None,
        "p95_ms": round(1000 * percentile(latencies, 95), 1) if latencies else None,
        "late_share": round(late / len(latencies), 4) if latencies else None,
    }


def _rtf(values: list[float]) -> dict:
    if not values:
        return {"answers": 0, "rtf_p50": None, "rtf_p95": None}
    return {
        "answers": len(values),
        "rtf_p50": round(percentile(values, 50), 3),
        "rtf_p95": round(percentile(values, 95), 3),
    }


def summarize(on: dict, one: dict, off: dict, deadline_s: float) -> dict:
    """``on``: alone, then loaded as the edge box runs (the batch job in an idle process); ``one``: loaded
    with every model in this process; ``off``: the same with classes off."""
    alone = _control(on["alone"]["control"], deadline_s)
    loaded = _control(on["loaded"]["control"], deadline_s)
    out = {
        "refill_deadline_ms": round(1000 * deadline_s, 1),
        "alone": {**alone, "voice": _rtf(on["alone"]["voice_rtf"]), "chunk_device_ms": on["alone"]["where"]},
        "loaded": {
            **loaded,
            "voice": _rtf(on["loaded"]["voice_rtf"]),
            "images": len(on["loaded"]["image_s"]),
            "chunk_device_ms": on["loaded"]["where"],
        },
        "control_p95_ratio": _ratio(loaded["p95_ms"], alone["p95_ms"]),
        "late_chunk_share": loaded["late_share"],
        "voice_rtf_alone_p95": _rtf(on["alone"]["voice_rtf"])["rtf_p95"],
        "voice_rtf_loaded_p95": _rtf(on["loaded"]["voice_rtf"])["rtf_p95"],
    }
    for name, run in (("one_process", one), ("classes_off", off)):
        control = _control(run["loaded"]["control"], deadline_s)
        out[name] = {
            **control,
            "voice": _rtf(run["loaded"]["voice_rtf"]),
            "images": len(run["loaded"]["image_s"]),
            "chunk_device_ms": run["loaded"]["where"],
            "control_p95_ratio": _ratio(control["p95_ms"], alone["p95_ms"]),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def voice_engine_config(args: argparse.Namespace):
    """The voice front-end's EngineConfig: ``--voice-engine-config`` ("": the defaults)."""
    from mstar_ros.edge.engine_settings import front_engine_config

    return front_engine_config(str(args.voice_engine_config or ""), None)


def load_models(args: argparse.Namespace) -> dict:
    from mstar_graphs.pi05.frontend import Pi05Policy
    from mstar_ros.webrtc.speech_models import load_speech_model

    return {
        "pi05": Pi05Policy.load(args.pi05_weights, preset=args.pi05_preset, progress=False),
        "voice": load_speech_model("orpheus", args.orpheus_weights, preset=args.orpheus_preset, progress=False),
        "images": load_speech_model("bagel", args.bagel_weights, preset=args.bagel_preset, progress=False),
    }


def run_mixed_bench(args: argparse.Namespace) -> int:
    from mstar.engine.intra_op import model_threads
    from mstar.progress import progress_bar
    from mstar_graphs.pi05.tiny import JOINT_LOWER, JOINT_UPPER
    from mstar_ros.bench.machine import machine_section
    from mstar_ros.bench.mixed_plot import plot_mixed, report_lines
    from mstar_ros.bench.pi05_workload import bag_observations
    from mstar_ros.bench.report_files import write_report

    models = load_models(args)
    policy = models["pi05"]
    observations = bag_observations(
        args.robots,
        args.seconds + 2.0,
        args.hz,
        args.seed,
        normalize=policy.normalization(JOINT_LOWER, JOINT_UPPER).state.normalize,
    )
    started = time.monotonic()
    batch = BatchProcess(args, model_threads(), scheduling="idle")  # loaded before anything is measured
    try:
        with progress_bar(desc="mixed: chunks, answers, images", unit="") as bar:
            on = asyncio.run(measure(models, observations, args, bar, classes=True, alone=True, batch=batch))
            one = asyncio.run(measure(models, observations, args, bar, classes=True, alone=False))
            off = asyncio.run(measure(models, observations, args, bar, classes=False, alone=False))
    finally:
        batch.close()
    report = {
        "bench": "mixed",
        "machine": machine_section(),
        "threads": model_threads(),
        "voice_engine": {
            "config": str(args.voice_engine_config or ""),
            "compile": voice_engine_config(args).compile,
            "forward_compiled": on["voice_forward_compiled"],
        },
        "workload": {
            "robots": args.robots,
            "hz": args.hz,
            "chunk_period_s": round(chunk_period_s(policy) if args.chunk_period is None else args.chunk_period, 3),
            "voice_pause_s": args.voice_pause,
            "seconds": args.seconds,
            "voice_peers": args.peers,
            "voice_max_tokens": args.max_tokens,
            "batch": f"BAGEL text-to-image, {args.image_steps or 'default'} steps, back to back",
            "presets": {"pi05": args.pi05_preset, "orpheus": args.orpheus_preset, "bagel": args.bagel_preset},
            "random_weights": any(getattr(m, "random_weights", False) for m in models.values()),
        },
        "classes": "control (pi0.5) > interactive (voice) > batch (images)",
        "batch_process": "loaded: the batch job in a process of its own under SCHED_IDLE (config/edge.yaml); "
        "one_process and classes_off: in this process",
        **summarize(on, one, off, refill_deadline_s(policy)),
        "run_s": round(time.monotonic() - started, 1),
    }
    write_report(report, report_lines(report), args.json, plot_mixed, args.plot)
    return 0
