"""Subprocesses started from ProcessSpecs and supervised as one group.

Each runs in its own session (a terminal's Ctrl-C reaches only us; we forward it once) and
dies with us. ``mstar-ros launch`` and ``demo`` run node sets with it, and so do the
benchmarks, so it lives below both ``cli`` and ``bench``.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from mstar_ros.launch_actions import NodeExit
from mstar_ros.launch_spec import ProcessSpec


def _child_setup() -> None:
    """In the child, before exec: Ctrl-C handled normally even if we were started with SIGINT
    ignored (a shell's background job), and SIGTERM when the launcher dies, however it dies."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProcessGroup:
    """Subprocesses started from ProcessSpecs, each in its own session (a terminal's Ctrl-C
    reaches only us; we forward it once), dying with us."""

    def __init__(self, out: Callable[[str], None] = lambda s: print(s, flush=True)) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.exits: dict[str, NodeExit] = {}  # per process: the last line of its stderr
        self._readers: list[threading.Thread] = []
        self.out = out

    def start(
        self, spec: ProcessSpec, *, stdout: TextIO | int | None = None, on_line: Callable[[str], None] | None = None
    ) -> subprocess.Popen:
        """``on_line``: the process's output goes through it line by line (a reader thread). Without
        ``on_line`` or ``stdout`` the output goes to ours, stderr through a thread that keeps its last line."""
        cmd = spec.command(python=sys.executable)
        merged = on_line is not None or stdout is not None
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE if on_line else stdout,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=_child_setup,
        )
        self.exits[spec.name] = NodeExit(spec)
        if on_line:
            self._read(spec, lambda: [on_line(line.rstrip("\n")) for line in proc.stdout])
        elif not merged:
            self._read(spec, lambda: self._pass_stderr(proc, self.exits[spec.name]))
        self.procs[spec.name] = proc
        self.out(f"[launch] {spec.name} started (pid {proc.pid}): {' '.join(cmd)}")
        return proc

    def _read(self, spec: ProcessSpec, reading: Callable[[], object]) -> None:
        reader = threading.Thread(target=reading, name=f"{spec.name}-output", daemon=True)
        reader.start()
        self._readers.append(reader)

    @staticmethod
    def _pass_stderr(proc: subprocess.Popen, exit_: NodeExit) -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            exit_.keep_line(line)

    def failure(self, name: str, code: int) -> str:
        """What a failed process says: NAME (EXECUTABLE) exited with status CODE: ITS LAST ERROR LINE."""
        return self.exits[name].message(code)

    def exited(self) -> dict[str, int]:
        return {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}

    def stop(self, grace_s: float = 15.0) -> dict[str, int]:
        """SIGINT, then SIGTERM after ``grace_s``, then SIGKILL; returns the exit codes."""
        for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = [p for p in self.procs.values() if p.poll() is None]
            if not alive:
                break
            for p in alive:
                p.send_signal(sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(p.poll() is None for p in alive):
                time.sleep(0.05)
        codes = {name: p.wait() for name, p in self.procs.items()}
        for reader in self._readers:  # their last lines (a process's error) are out before we go on
            reader.join(timeout=2.0)
        return codes


def wait_for_stop(group: ProcessGroup, names: Sequence[str] | None = None) -> str:
    """Blocks until SIGINT/SIGTERM ('signal') or until one of ``names`` (any, if None) exits (its name)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.1):
            done = [n for n in group.exited() if names is None or n in names]
            if done:
                return done[0]
        return "signal"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
