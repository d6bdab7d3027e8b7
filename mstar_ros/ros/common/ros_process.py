"""rclpy next to the Conductor in one process: the ROS context, one executor thread, signals, shutdown.

    async with RosProcess("mstar_orpheus_node", ros_args) as ros:
        ros.add(node, other_node)
        ros.spin()                  # callbacks run on one thread; the Conductor keeps this loop
        await ros.stopped(duration) # Ctrl-C, SIGTERM, or after ``duration`` seconds

One executor thread: ROS callbacks take as little CPU from the model as they can. At exit the
executor stops and its thread is joined before rclpy shuts down: a thread still inside rcl
at interpreter exit aborts the process ("terminate called without an active exception").
After the shutdown, the Fast DDS shared-memory ports the process used and nobody uses any more
are removed (mstar_ros.bag.shm_ports).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from collections.abc import Coroutine, Sequence
from typing import Any

log = logging.getLogger("mstar_ros.ros")


def split_ros_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(our arguments, the ``--ros-args ...`` tail that rclpy takes) of a node's command line."""
    argv = list(argv)
    if "--ros-args" not in argv:
        return argv, []
    cut = argv.index("--ros-args")
    return argv[:cut], argv[cut:]


class RosProcess:
    def __init__(self, program: str, ros_args: Sequence[str]) -> None:
        self.program, self.ros_args = program, list(ros_args)
        self.stop = asyncio.Event()
        self.executor = None
        self._spinner: threading.Thread | None = None

    async def __aenter__(self) -> RosProcess:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        rclpy.init(args=[self.program] + self.ros_args)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        self.executor = SingleThreadedExecutor()
        return self

    def add(self, *nodes) -> None:
        for node in nodes:
            self.executor.add_node(node)

    def spin(self) -> None:
        self._spinner = threading.Thread(target=self._spin, name="rclpy", daemon=True)
        self._spinner.start()

    def _spin(self) -> None:
        """executor.spin(), except that a callback's exception is logged and spinning goes on: one
        node's bug must not silence every node of the process (rclpy's spin would end the thread)."""
        from rclpy.executors import ExternalShutdownException, ShutdownException

        executor = self.executor
        while executor.context.ok() and not executor._is_shutdown:  # what Executor.spin() loops on
            try:
                executor.spin_once()
            except (ExternalShutdownException, ShutdownException, KeyboardInterrupt):
                return
            except Exception:
                if not executor.context.ok():
                    return
                log.exception("%s: a ROS callback failed (the other callbacks go on)", self.program)

    async def stopped(self, duration: float = 0.0) -> None:
        """Returns at SIGINT/SIGTERM, or after ``duration`` seconds (0: no limit)."""
        try:
            await asyncio.wait_for(self.stop.wait(), duration or None)
        except asyncio.TimeoutError:
            pass

    async def __aexit__(self, *exc: object) -> None:
        from mstar_ros.bag.shm_ports import shut_down_removing_ports

        shut_down_removing_ports(self._shut_down)

    def _shut_down(self) -> None:
        import rclpy

        if self.executor is not None:
            self.executor.shutdown()
            if self._spinner is not None and self._spinner.is_alive():
                self._spinner.join(timeout=5)
            for node in self.executor.get_nodes():
                node.destroy_node()
        rclpy.try_shutdown()


def node_process_main(
    program: str, argv: Sequence[str], parse_args, serve, print_summary, *, spin_default: bool = True
) -> int:
    """A node process's ``main``: localhost-only DDS and OpenMP spin defaults before torch is imported,
    logging, ``parse_args(argv) -> (args, ros_args)``, ``serve(args, ros_args)`` under
    :func:`run_serving`, then ``print_summary(summary)``. The exit status."""
    from mstar_ros.bag.ros_env import apply_localhost_defaults

    apply_localhost_defaults()
    if spin_default:
        from mstar_ros.omp_defaults import apply_spin_default

        apply_spin_default()  # before torch is imported: see mstar_ros.omp_defaults
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    args, ros_args = parse_args(list(argv))
    status, summary = run_serving(program, serve(args, ros_args), args.summary_json)
    if summary is not None:
        print_summary(summary)
    return status


def run_serving(
    program: str, serving: Coroutine[Any, Any, dict], summary_json: str | None = None
) -> tuple[int, dict | None]:
    """Runs a node process's ``serving`` coroutine: (exit status, its summary). Bad parameters, --ros-args,
    weights or placement are said in one line, no traceback (status 2) -- also when a Worker process
    found them bad while setting up; Ctrl-C while starting is 130.
    The summary is also written as JSON to ``summary_json``."""
    from mstar.conductor import WorkerSetupError

    try:
        summary = asyncio.run(serving)
    except KeyboardInterrupt:  # stopped while starting, before the signal handlers were installed
        return 130, None
    except WorkerSetupError as exc:  # the Worker's own "Type: message", as a failure in this process says it
        print(f"{program}: error: {exc.error} (worker rank {exc.rank})", file=sys.stderr)
        return 2, None
    except Exception as exc:
        from rclpy._rclpy_pybind11 import RCLError
        from rclpy.exceptions import ParameterException

        if not isinstance(exc, (ValueError, FileNotFoundError, ParameterException, RCLError)):
            raise
        print(f"{program}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2, None
    if summary_json:
        with open(summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0, summary
