"""A pi0.5 chunk request is control-class by default (a robot waits for it); a caller may say otherwise."""

from __future__ import annotations

import torch

from mstar.priority import Priority
from mstar_graphs.pi05.frontend import Pi05Policy


def test_chunk_requests_are_control_unless_told():
    policy = Pi05Policy.load(progress=False)
    images, state = torch.zeros(2, 224, 224, 3, dtype=torch.uint8), torch.zeros(8)
    assert policy.request(images, state, "go").priority is Priority.CONTROL
    assert policy.request(images, state, "go", priority="batch").priority is Priority.BATCH
