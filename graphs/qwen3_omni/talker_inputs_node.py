"""The graph node that turns the Thinker's rows into the Talker's inputs (mstar_graphs.qwen3_omni.talker_prompt).

Stateless: inputs ``prompt_ids`` [P] and ``rows`` [P + reply - 1, 2 H] (the Thinker's per-row
output: input embedding | hidden after ``accept_hidden_layer``); or ``rows`` of the prompt alone [P, 2 H]
and ``first_token``, the reply's first token, for a Talker that starts while the Thinker is still
replying (its later rows then stream to the Talker's ``reply_rows``; the first token's row is its
token embedding, as the Thinker's own input row for it is); or, to speak a given text without
the Thinker (``/v1/audio/speech``), ``say_ids``: the rows are then the token embeddings of the prompt
and the text, as the Thinker's would be for that reply (the hidden half is read at audio rows only,
and a spoken text's prompt has none); outputs the Talker call's
``input_ids`` (placeholders), ``embeds`` and ``embed_mask`` (every row an embedding), and the
``trailing`` text rows (not for a streamed reply), ``tts_eos`` and ``tts_pad`` rows its feedback reads,
and ``audio_cap``, a flag: the Talker's frames are capped by the text's length (``talker_cap``). With ``image_grid_thw`` (a prompt with
images) also the Talker's M-RoPE ``rope_positions``: the reference numbers the Talker's prompt (the user
turns' tokens, then its 9 assistant rows) as it numbers the Thinker's. It shares the Talker's projections
and the Thinker's token embeddings (same process: same weights).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.qwen3_omni.mrope_positions import thinker_positions
from mstar_graphs.qwen3_omni.talker_prompt import ASSISTANT_ROWS, talker_inputs, user_rows


class TalkerInputsNode(NodeSubmodule):
    def __init__(self, talker, thinker_embed_tokens, speaker: str = "ethan") -> None:
        super().__init__()
        self._talker = [talker]  # not submodules: they belong to the Talker and Thinker nodes
        self._embed_tokens = [thinker_embed_tokens]
        self.speaker = speaker

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"calls": list(calls)}

    def batch_key(self, call: NodeCall):
        return "talker_inputs"

    def split_outputs(self, outputs, calls):
        return outputs["each"]

    def forward(self, calls: list[NodeCall]) -> dict:  # type: ignore[override]
        talker, embed = self._talker[0], self._embed_tokens[0]
        cfg = talker.config
        width = cfg.thinker_config.text_config.hidden_size
        each = []
        for call in calls:
            streamed = False
            if "say_ids" in call.inputs:  # the reply is given: its rows are token embeddings (its <|im_end|>: unseen)
                ids = torch.cat([call.inputs["prompt_ids"].reshape(-1), call.inputs["say_ids"].reshape(-1)])
                e = embed(ids.to(embed.weight.device)).to(talker.dtype)
                rows = torch.cat([e, torch.zeros_like(e)], dim=-1)
            else:  # the engine hands inputs over on the CPU; the Talker may be on a GPU
                rows = call.inputs["rows"].to(device=embed.weight.device, dtype=talker.dtype)
                streamed = rows.shape[0] == call.inputs["prompt_ids"].numel()
                if streamed:  # the reply goes on streaming to the Talker: its first token's row here
                    if "first_token" not in call.inputs:
                        raise ValueError(
                            "talker_inputs: the Thinker's rows hold the prompt only, and no first reply token came"
                        )
                    first = embed(call.inputs["first_token"].reshape(1).to(embed.weight.device)).to(talker.dtype)
                    rows = torch.cat([rows, torch.cat([first, torch.zeros_like(first)], dim=-1)])
            speaker = (
                int(call.meta["speaker"]) if "speaker" in call.meta else self.speaker
            )  # request meta talker_inputs.speaker
            made = talker_inputs(
                talker,
                embed,
                cfg,
                call.inputs["prompt_ids"].reshape(-1).tolist(),
                rows[:, :width],
                rows[:, width:],
                speaker,
            )
            n = made.prefill.shape[0]
            out = {
                "input_ids": torch.zeros(n, dtype=torch.long),
                "embeds": made.prefill,
                "embed_mask": torch.ones(n, dtype=torch.bool),
                "tts_eos": made.trailing[-1],
                "tts_pad": made.tts_pad,
            }
            if "say_ids" in call.inputs or not streamed:
                out["trailing"] = made.trailing
            if call.meta.get("audio_cap", 1):  # request meta talker_inputs.audio_cap = 0 lifts the Talker's cap
                out["audio_cap"] = torch.ones(1, dtype=torch.long)
            if "image_grid_thw" in call.inputs:
                prompt = call.inputs["prompt_ids"].reshape(-1).tolist()
                ids = [prompt[i] for i in user_rows(prompt, cfg)] + [0] * ASSISTANT_ROWS  # codec rows: plain text axes
                out["rope_positions"] = thinker_positions(
                    ids, cfg, call.inputs["image_grid_thw"].reshape(-1, 3).tolist()
                )[0]
            each.append(out)
        return {"each": each}
