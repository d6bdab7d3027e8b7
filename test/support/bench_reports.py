"""What every benchmark report must say about where it ran: the machine and each system's dtype."""

from __future__ import annotations

import torch

DTYPES = ("float32", "bfloat16", "float16")


def assert_machine_and_dtypes(report: dict, *, requested: str = "auto", baseline: bool = True) -> None:
    m = report["machine"]
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # the same machine as this test's
    assert m["threads"] >= 1 and m["torch"] == torch.__version__ and isinstance(m["bf16_instructions"], list)
    ours = report["dtypes"]["ours"]
    assert ours["requested"] == requested and ours["dtype"] in DTYPES and ours["reason"]
    if requested != "auto":
        assert ours["dtype"] == requested
    if baseline:
        assert report["dtypes"]["baseline"]["dtype"] in DTYPES and report["dtypes"]["baseline"]["why"]
    else:
        assert "baseline" not in report["dtypes"]
