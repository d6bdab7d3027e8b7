"""mstar.engine.intra_op: who gets an OpenMP team (each case in a fresh interpreter: support.team_probe)."""

import os

import torch

from mstar.engine import intra_op
from support.team_probe import run_fresh


def test_confining_hands_back_the_team_the_thread_already_had():
    run_fresh("""
        start = os_threads()
        parallel_op()
        assert settled() == start + 1, "a team of two: one worker thread"
        assert intra_op.confine_to_one_thread() is True
        assert settled() == start, "its worker was joined"
        assert torch.get_num_threads() == 1
        parallel_op()
        assert settled() == start, "one thread: no team again"
    """)


def test_threads_started_after_confinement_take_one_thread_and_build_no_team():
    run_fresh("""
        intra_op.confine_to_one_thread()
        start = os_threads()

        def work():
            parallel_op()
            x = torch.randn(256, 256)
            x @ x, x.bfloat16() @ x.bfloat16()  # MKL and oneDNN take the thread's width too
            return torch.get_num_threads(), os_threads()

        width, during = on_thread(work)
        assert width == 1 and during == start + 1, (width, during, start)  # the thread itself, no worker
    """)


def test_a_claimed_width_survives_the_one_thread_default_and_keeps_it():
    run_fresh("""
        claimed, go, out = threading.Event(), threading.Event(), {}

        def model_thread():
            out["claimed"] = intra_op.claim_team()
            claimed.set()
            go.wait()
            parallel_op()
            out["later"] = torch.get_num_threads()

        t = threading.Thread(target=model_thread)
        t.start()
        claimed.wait()
        intra_op.confine_to_one_thread()
        go.set()
        t.join()
        assert out == {"claimed": 2, "later": 2}, out
        assert intra_op.model_threads() == 2 and torch.get_num_threads() == 1
        # a second model thread (a tensor-parallel follower) gets the model's width ...
        assert on_thread(intra_op.claim_team) == 2
        # ... and threads started after it still default to one
        assert on_thread(torch.get_num_threads) == 1
    """)


def test_release_finds_torchs_own_libgomp():
    path = intra_op.libgomp_path()
    assert path is not None and path.startswith(os.path.dirname(torch.__file__)), path
    assert intra_op.release_team() is True  # this thread (pytest's) may or may not hold a team: both succeed
