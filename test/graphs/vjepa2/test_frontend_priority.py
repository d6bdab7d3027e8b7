"""V-JEPA 2-AC's requests are control-class by default (a robot waits for them); a caller may say otherwise."""

from __future__ import annotations

import pytest
import torch

from mstar.priority import Priority
from mstar_graphs.vjepa2.frontend import encode_request, observe_request, rollout_request


def test_requests_default_to_control_and_take_an_override():
    frames, row = torch.zeros(1, 4, 4, 3, dtype=torch.uint8), torch.zeros(1, 7)
    assert encode_request(frames).priority is Priority.CONTROL
    assert observe_request(frames, row, row, session_id="s").priority is Priority.CONTROL
    assert rollout_request(torch.zeros(2, 7), session_id="s", priority="batch").priority is Priority.BATCH
    with pytest.raises(ValueError, match="priority"):
        rollout_request(torch.zeros(2, 7), session_id="s", priority="soon")
