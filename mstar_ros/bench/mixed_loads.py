"""The loads of ``mstar-ros bench mixed`` beside the robots: voice streams and a batch job, until told to stop.

- Voice: ``peers`` concurrent conversations on the voice Conductor: each asks its next answer once the
  last one has played out (its audio's length after it was asked) and ``pause_s`` more (the user's
  turn); ``pause_s`` < 0: as soon as the last one was generated (back to back). A response's real-time factor (RTF) is its generation time (submit ->
  last audio chunk) over the seconds of audio it made: under 1, it is made faster than it plays.
- Batch: text-to-image requests on the image model's Conductor, one after another (an offline job).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import msgspec

from mstar_ros.bench.webrtc_peers import TEXTS

clock = time.perf_counter


async def speak_until(
    model, conductor, peers: int, stop: asyncio.Event, max_tokens: int, bar=None, pause_s: float = -1.0
) -> list[float]:
    """RTF of every answer finished before ``stop`` (answers still running at ``stop`` are cancelled)."""
    rtfs: list[float] = []
    ids = itertools.count()

    async def peer(p: int) -> None:
        for turn in itertools.count():
            if stop.is_set():
                return
            request = model.request(TEXTS[(p + turn) % len(TEXTS)], request_id=f"voice-{next(ids)}")
            # short answers, seeded: random tiny weights would otherwise talk to max_tokens
            request.sampling = msgspec.structs.replace(request.sampling, max_tokens=max_tokens, seed=p * 1000 + turn)
            start, samples = clock(), 0
            stream = conductor.submit(request)
            try:
                async for out in stream:
                    if out.name == model.audio_output:
                        samples += out.data.numel()
                    if stop.is_set():
                        await conductor.cancel(request.request_id)
                        return
            except Exception:  # cancelled at stop
                if stop.is_set():
                    return
                raise
            if samples:
                rtfs.append((clock() - start) / (samples / model.sample_rate))
                if bar is not None:
                    bar.update()
            if pause_s >= 0:  # the answer plays out, then the user speaks
                played = start + samples / model.sample_rate + pause_s
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, played - clock()))

    await asyncio.gather(*(peer(p) for p in range(peers)))
    return rtfs


async def images_until(model, conductor, stop: asyncio.Event, steps: int | None, bar=None) -> list[float]:
    """Seconds per image of every image finished before ``stop``."""
    took: list[float] = []
    size = model.image_size(None, [])
    for i in itertools.count():
        if stop.is_set():
            return took
        start = clock()
        events = model.generate_images(
            conductor,
            prompt="a red block on a table",
            images=[],
            size=size,
            n=1,
            seed=i,
            steps=steps,
            request_id=f"batch-{i}",
        )
        try:
            async for _event in events:
                if stop.is_set():
                    return took
        finally:
            await events.aclose()
        took.append(clock() - start)
        if bar is not None:
            bar.update()
    return took
