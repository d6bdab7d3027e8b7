"""Progress bars that never fail or hang the work they report: a reader gone mid-run (a closed pipe) is
dropped from, and a process whose bars wrote to it still exits."""

from __future__ import annotations

import io
import subprocess
import sys

from mstar.progress import QuietOnBrokenPipe, progress_bar

# a bar on another thread (weights load on the device thread), then one left open, collected at exit
LOAD_THEN_EXIT = """
import sys, threading
from {module} import {name} as bar_of
def load():
    with bar_of(total=3, desc="weights") as bar:
        for _ in range(3):
            bar.update(1)
worker = threading.Thread(target=load)
worker.start(); worker.join()
left_open = bar_of(total=1, desc="left open")
"""


def run_with_closed_pipes(module: str, name: str) -> int | None:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD_THEN_EXIT.format(module=module, name=name)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    proc.stderr.close()  # the reader is gone: every write is a BrokenPipeError
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return None
    finally:
        proc.kill()


def test_a_process_whose_bars_lost_their_reader_exits():
    # with tqdm itself (module "tqdm", name "tqdm") this hangs: its refresh keeps its lock when the write
    # raises, and the bar collected at exit waits for it forever (tqdm 4.67, checked by hand)
    assert run_with_closed_pipes("mstar.progress", "progress_bar") == 0


def test_writes_to_a_closed_stream_are_dropped_and_the_rest_passes_through():
    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    gone = QuietOnBrokenPipe(Gone())
    assert gone.write("12%") == 3 and gone.gone
    gone.flush()  # nothing raised
    kept = io.StringIO()
    bar = progress_bar(total=2, file=kept, desc="work")
    bar.update(2)
    bar.close()
    assert "work" in kept.getvalue() and "2/2" in kept.getvalue()
    assert QuietOnBrokenPipe(kept).isatty() is False
