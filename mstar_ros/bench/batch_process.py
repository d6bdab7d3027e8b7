"""The batch job of ``bench mixed`` in a process of its own, as the edge box's ``batch`` group runs it.

    python -m mstar_ros.bench.batch_process --scheduling idle --threads 2 [--preset bench] [--weights DIR]
                                            [--steps N] [--dtype D]

It takes its CPU policy (mstar_ros.edge.os_scheduling) and intra-op threads before torch is imported,
as ``mstar_edge_host`` does, loads the image model, says ``ready`` and waits for a line on stdin; then it
makes text-to-image images back to back (mstar_ros.bench.mixed_loads.images_until) until SIGTERM or
stdin's end (the bench stopped, or died), and prints the seconds of each image it finished as one JSON
line. ``BatchProcess`` drives it from the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import select
import signal
import subprocess
import sys
import threading


async def _serve(args: argparse.Namespace) -> list[float]:
    from mstar.engine.config import EngineConfig
    from mstar_ros.bench.mixed_loads import images_until
    from mstar_ros.edge.classes import classed_conductor
    from mstar_ros.webrtc.speech_models import load_speech_model

    model = load_speech_model("bagel", args.weights, preset=args.preset, progress=False)
    config = EngineConfig(dtype=args.dtype)
    async with classed_conductor(model.graph(), model.modules(), config) as conductor:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        if not await loop.run_in_executor(None, sys.stdin.readline):
            return []  # stdin closed before "go": the bench has gone
        # and when it closes later (the bench stopped it, or died), stop too: never an orphan hogging cores
        threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
        return await images_until(model, conductor, stop, args.steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheduling", default="idle", help="normal or idle (default idle)")
    p.add_argument("--threads", type=int, required=True, help="intra-op threads")
    p.add_argument("--preset", default="bench", help="generated BAGEL preset (default bench)")
    p.add_argument("--weights", default=None, help="a real BAGEL checkpoint instead")
    p.add_argument("--steps", type=int, default=None, help="flow steps per image (default: the model's)")
    p.add_argument("--dtype", default="auto", help="engine dtype (default auto)")
    args = p.parse_args(argv)
    from mstar_ros.edge.host import set_intra_op_threads
    from mstar_ros.edge.os_scheduling import apply_scheduling

    apply_scheduling(args.scheduling)  # before torch: every thread it starts inherits the policy
    set_intra_op_threads(args.threads)
    took = asyncio.run(_serve(args))
    print(json.dumps([round(t, 3) for t in took]), flush=True)
    return 0


LOAD_TIMEOUT_S = 600.0  # the bench preset loads in seconds; a real BAGEL checkpoint in minutes


class BatchProcess:
    """The batch child, started and loaded before the measurement: ``start()`` sets it making images,
    ``finish()`` stops it and returns the seconds of the images it finished."""

    def __init__(self, args: argparse.Namespace, threads: int, scheduling: str = "idle") -> None:
        command = [sys.executable, "-m", "mstar_ros.bench.batch_process", "--scheduling", scheduling]
        command += ["--threads", str(threads), "--preset", args.bagel_preset, "--dtype", args.dtype]
        command += ["--weights", args.bagel_weights] if args.bagel_weights else []
        command += ["--steps", str(args.image_steps)] if args.image_steps else []
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        said = ""
        if select.select([self.proc.stdout], [], [], LOAD_TIMEOUT_S)[0]:  # a child stuck loading: no hang
            said = self.proc.stdout.readline().strip()
        if said != "ready":
            self.proc.kill()
            raise RuntimeError(f"the batch process did not start (it said {said!r}, exit {self.proc.wait()})")

    def start(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> list[float]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the batch process exited with {self.proc.returncode}")
        return json.loads(out.strip().splitlines()[-1])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
