"""Side inputs that grow while a Loop runs: a streaming edge into a running engine-resident Loop.

A Loop call may name ports as ``fed_inputs``: their rows keep arriving after the call started, in
``FeedInput`` messages (the Thinker's reply rows reaching the Talker's Loop as they are made). They
join the sequence's side inputs, which its module's feedback reads. Before each sampling step the
engine asks the module (``ARModule.feedback_ready``) whether the rows that step's feedback needs are
there; a sequence whose rows are not is held back, its KV kept, until they arrive or the stream ends
(``final``), so its output does not depend on how fast the rows came.
"""

from __future__ import annotations

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.messages import FeedInput
from mstar.engine.sequence import Sequence
from mstar.engine.step_feedback import feedback_call, last_sample


def as_rows(value: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """Stream items (each [rows, width] or [width]) as one [rows, width] tensor."""
    items = value if isinstance(value, list) else [value] if value.dim() <= 2 else list(value)
    rows = [t.reshape(-1, t.shape[-1]) for t in items]
    return torch.cat(rows) if rows else torch.zeros(0, 0)


def append_fed(seq: Sequence, msg: FeedInput, rows: torch.Tensor | None) -> None:
    """``rows`` (this message's items, or None) join ``seq``'s side input; ``final`` closes it."""
    if msg.port not in seq.open_inputs:
        raise ValueError(
            f"node {seq.node!r}: rows for port {msg.port!r}, which its call does not take as a fed "
            f"input (fed inputs still open: {sorted(seq.open_inputs)})"
        )
    if rows is not None and rows.numel():
        if not torch.isfinite(rows).all():
            raise ValueError(f"node {seq.node!r}: rows fed to {msg.port!r} contain NaN or infinite values")
        have = seq.side_inputs.get(msg.port)
        if have is not None and have.numel() and have.shape[-1] != rows.shape[-1]:
            raise ValueError(
                f"node {seq.node!r}: rows fed to {msg.port!r} are {rows.shape[-1]} wide, earlier ones {have.shape[-1]}"
            )
        seq.side_inputs[msg.port] = rows if have is None or not have.numel() else torch.cat([have, rows])
    if msg.final:
        seq.open_inputs.discard(msg.port)


def waits_for_rows(module: ARModule, seq: Sequence) -> bool:
    """Whether ``seq``'s next sampling step must wait for fed rows its feedback reads."""
    call = seq.call
    if not seq.open_inputs or call is None or not call.wants_token or call.msg.loop is None:
        return False
    if last_sample(module, seq):  # no feedback follows it
        return False
    return not module.feedback_ready(feedback_call(seq))
