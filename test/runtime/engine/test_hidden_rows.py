"""A module that says ``accepts_hidden_rows`` gets the step's sampled rows and returns only those."""

from __future__ import annotations

import torch

from mstar.engine.messages import LoopSpec
from mstar.sampling_params import SamplingParams
from support.engine_stepper import EngineStepper
from support.toy_models import ToyLM


class NarrowToyLM(ToyLM):
    accepts_hidden_rows = True

    def __init__(self) -> None:
        super().__init__()
        self.rows_seen: list[list[int]] = []

    def forward(self, input_ids, positions, attn, hidden_rows=None):
        hidden = super().forward(input_ids, positions, attn)
        if hidden_rows is None:
            self.rows_seen.append([])
            return hidden
        self.rows_seen.append(hidden_rows.tolist())
        return hidden.index_select(0, hidden_rows)


def _answers(lm: ToyLM) -> list[list[int]]:
    st = EngineStepper(lm, ["llm"])
    calls = [
        st.call("llm", rid, {"input_ids": torch.tensor(ids)}, loop=LoopSpec(max_iters=4), sampling=SamplingParams())
        for rid, ids in (("a", [5, 17, 3, 44, 9]), ("b", [61, 2, 8]))
    ]
    st.drain()
    return [[int(st.store.get(r.outputs["token"])) for r in replies if "token" in r.outputs] for replies in calls]


def test_sampled_tokens_equal_and_only_last_rows_are_asked_for():
    narrow = NarrowToyLM()
    answers = _answers(narrow)
    assert [len(a) for a in answers] == [4, 4]
    assert answers == _answers(ToyLM())
    # the two prompts' step (8 rows) asks for their last rows; decode steps (a row each) ask for none
    assert narrow.rows_seen[0] == [4, 7]
    assert all(rows == [] for rows in narrow.rows_seen[1:])
