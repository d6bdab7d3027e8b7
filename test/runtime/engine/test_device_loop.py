"""mstar.engine.device_loop: the device thread keeps the process's one OpenMP team (issue 16;
a fresh interpreter: support.team_probe)."""

from support.team_probe import run_fresh


def test_the_device_thread_keeps_the_only_team():
    run_fresh("""
        start = os_threads()
        parallel_op()  # torch work on this thread before any device thread: a team of two
        assert settled() == start + 1

        dt = device_thread()
        assert dt.threads == 2 and run_on_device(torch.get_num_threads) == 2
        assert torch.get_num_threads() == 1, "the thread that started it runs torch on one thread"
        run_on_device(parallel_op)
        with_device = settled()
        assert with_device == start + 2, (with_device, start)  # the device thread and its worker; ours went back

        parallel_op()  # torch work here again: no second team
        later = on_thread(lambda: (parallel_op(), torch.get_num_threads(), os_threads())[1:])
        assert later == (1, with_device + 1), later  # a thread started later: one thread, itself only
        assert settled() == with_device
    """)
