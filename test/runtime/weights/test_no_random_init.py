import subprocess
import sys

import torch
import torch.nn.init as init

from mstar.weights import no_random_init


def test_fills_are_skipped_inside_and_restored_after():
    before = init.normal_
    weight = torch.full((3, 3), 7.0)
    with no_random_init():
        torch.nn.init.normal_(weight)
        assert torch.equal(weight, torch.full((3, 3), 7.0))
        linear = torch.nn.Linear(4, 4, device="meta")
    assert init.normal_ is before
    assert linear.weight.is_meta
    torch.nn.init.normal_(weight)
    assert not torch.equal(weight, torch.full((3, 3), 7.0))


def test_fills_are_restored_when_the_build_raises():
    before = init.kaiming_uniform_
    try:
        with no_random_init():
            raise ValueError("bad config")
    except ValueError:
        pass
    assert init.kaiming_uniform_ is before


def test_a_meta_build_does_not_import_dynamo():
    # the reason for the context manager: reset_parameters on meta imports torch._dynamo (seconds)
    code = (
        "import sys, torch; from mstar.weights import no_random_init\n"
        "with torch.device('meta'), no_random_init(): torch.nn.Linear(8, 8); torch.nn.Embedding(8, 8)\n"
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
