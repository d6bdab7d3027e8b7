"""The Qwen3-Omni Walk Graph: Thinker -> Talker (with its code predictor) -> Code2Wav, text and audio out.

    input.features --> audio_encoder --embeds--> thinker <--token-- (decode Loop feedback)
    input.prompt_ids -----------------------------^  |--token--> output.text_ids
                                                     |--rows (every computed row, at each call's end)-->
                                                     \\--step_rows~> talker.reply_rows [Fixed(1), fed to its Loop]
    input.prompt_ids --> talker_inputs --prefill rows, trailing text, tts_eos, tts_pad--> talker (Loop, feedback:
                         code predictor -> frame) --frame~> code2wav [25-frame chunks] --audio--> output.audio
                                                                                \\--frame--> output.codes

    input.pcm ~> audio_frames --log_mel~> audio_encoder --embeds--> audio_prompt --input_ids, embed_mask-->
    thinker (a turn streamed in as it is said: mstar_graphs.qwen3_omni.audio_stream)

    input.pixel_values, image_grid_thw --> vision_encoder --embeds (+ deepstack rows)--> thinker
    input.prompt_ids, image_grid_thw --> image_positions --rope_positions (M-RoPE t/h/w)--> thinker
    talker_inputs --rope_positions--> talker

Walks, chosen by ``next_walk``: ``talk`` alone for a request that gives the text to say
(``say_ids``: text to speech without the Thinker); else ``prefill_stream`` (wait for the streamed turn's
end, its frames having been computed as it came, then encode it and widen the prompt's audio slot),
``prefill_stream_media`` (the same with images: the vision encoder runs while the turn is said, and
the images' positions and rows follow the widened prompt), ``prefill_audio`` (the audio encoder, then the Thinker's prompt with its rows at ``<|audio_pad|>``),
``prefill_vision`` (the vision encoder, then the prompt with its rows at ``<|image_pad|>``),
``prefill_media`` (both encoders, their rows merged in prompt order by ``media_prompt``) or
``prefill_text``; then ``think_and_talk``: the Talker's inputs from the prompt's rows and the reply's
first token, then at once the Thinker's decode Loop until ``<|im_end|>`` and the Talker's Loop until
codec EOS (or the reply's audio cap, ``talker_cap``), each iteration's frame streamed to Code2Wav,
which keeps each request's stream between
its chunks (``code2wav_stream``: the samples of the reference's decode, whatever the chunks). The Thinker's Loop streams each step's row
into the running Talker (``FixedChunkPolicy(1)``, a fed input): the Talker reads reply row i + 1 after
its frame i, and waits for it when the Thinker is behind, so it is fed what the reference feeds it
(the reference starts the Talker once the reply is complete); only each row's projection, made as it
comes rather than in one batch, may differ in the last bit (1.3e-7 at most, measured). A text-only request runs ``think`` (the Thinker's Loop)
alone; ``talker_after_reply`` runs ``think`` then ``talk`` (the Talker on the complete reply, as the
reference orders it; its text rows then projected in one batch as the reference does, to the last bit).
"""

from __future__ import annotations

from mstar.graph import (
    AwaitInput,
    Call,
    DynamicLoop,
    FixedChunkPolicy,
    GraphEdge,
    GraphNode,
    LeftContextChunkPolicy,
    ModelGraph,
    Parallel,
    PartitionConnection,
    PartitionTopology,
    Sequential,
    StopOnValues,
    StreamingGraphEdge,
    WholeStreamPolicy,
)
from mstar_graphs.qwen3_omni.audio_stream import CHUNK_ITEMS, CONTEXT_ITEMS

CHUNK_FRAMES = 25  # Code2Wav's chunks carry no left context: it keeps each stream's itself


def walk_chooser(im_end: int):
    def next_walk(state) -> str | None:
        meta, last = state.request.meta, state.last_walk
        audio = meta.get("audio", True)
        if last is None:
            if "say_ids" in state.request.inputs:  # speak the given text: the Talker alone
                return "talk"
            if "pcm" in state.request.inputs:
                return "prefill_stream_media" if "pixel_values" in state.request.inputs else "prefill_stream"
            if "pixel_values" in state.request.inputs:
                return "prefill_media" if "features" in state.request.inputs else "prefill_vision"
            return "prefill_audio" if "features" in state.request.inputs else "prefill_text"
        if last in (
            "prefill_stream",
            "prefill_stream_media",
            "prefill_audio",
            "prefill_vision",
            "prefill_media",
            "prefill_text",
        ):
            first = state.value("thinker.token")
            if first is not None and int(first) == im_end:
                return None  # an empty reply: nothing to say
            # the Talker needs two reply tokens (its first row and one more): a one-token reply stays text
            if meta.get("thinker_max_tokens", 1024) <= 1:
                return None
            # the Talker streams the reply as it is made, unless asked to start once it is complete
            return "think_and_talk" if audio and not meta.get("talker_after_reply", False) else "think"
        if last == "think" and audio:
            return "talk"
        return None

    return next_walk


def budget(state, key: str, default: int) -> int:
    """The request's ``key`` budget, less what a streamed turn's widened prompt took of the room the request
    left for it (the request sized it with the turn's one-pad slot; ``meta["<key>_room"]`` is that room)."""
    want = state.request.meta.get(key, default)
    widened = state.value("audio_prompt.input_ids")
    room = state.request.meta.get(f"{key}_room")
    if widened is None or room is None:
        return want
    return max(1, min(want, room - (widened.numel() - state.request.inputs["prompt_ids"].numel())))


def qwen3_omni_graph(im_end: int, codec_eos: int, first_chunk: int | None = None) -> ModelGraph:
    """``first_chunk``: frames of Code2Wav's first chunk (default 25, as later ones; fewer: audio starts
    sooner, and the same audio comes)."""
    thinker_loop = DynamicLoop(
        "thinker",
        trip_count=lambda s: budget(s, "thinker_max_tokens", 1024) - 1,
        stop=StopOnValues("thinker.token", (im_end,)),
    )
    talker_loop = DynamicLoop(
        "talker",
        trip_count=lambda s: budget(s, "talker_max_tokens", 4096),
        stop=StopOnValues("talker.token", (codec_eos,)),
    )
    return ModelGraph(
        name="qwen3_omni",
        nodes=[
            GraphNode("audio_frames", inputs=["pcm"], outputs=["log_mel"]),
            GraphNode(
                "audio_encoder",
                inputs=["features", "clip_frames", "log_mel"],
                outputs=["embeds"],
                optional_inputs=["features", "clip_frames"],
            ),
            GraphNode("audio_prompt", inputs=["prompt_ids", "embeds"], outputs=["input_ids", "embed_mask"]),
            GraphNode("vision_encoder", inputs=["pixel_values", "image_grid_thw"], outputs=["embeds"]),
            GraphNode("image_positions", inputs=["prompt_ids", "image_grid_thw"], outputs=["rope_positions"]),
            GraphNode("media_prompt", inputs=["prompt_ids", "audio_embeds", "image_embeds"], outputs=["embeds"]),
            GraphNode(
                "thinker",
                inputs=["input_ids", "embeds", "embed_mask", "rope_positions"],
                outputs=["token", "rows", "step_rows"],
                engine="ar",
                optional_inputs=["embeds", "embed_mask", "rope_positions"],
            ),
            GraphNode(
                "talker_inputs",
                inputs=["prompt_ids", "rows", "first_token", "say_ids", "image_grid_thw"],
                outputs=[
                    "input_ids",
                    "embeds",
                    "embed_mask",
                    "trailing",
                    "tts_eos",
                    "tts_pad",
                    "audio_cap",
                    "rope_positions",
                ],
                optional_inputs=["rows", "first_token", "say_ids", "image_grid_thw"],
            ),
            GraphNode(
                "talker",
                inputs=[
                    "input_ids",
                    "embeds",
                    "embed_mask",
                    "trailing",
                    "reply_rows",
                    "tts_eos",
                    "tts_pad",
                    "audio_cap",
                    "rope_positions",
                ],
                outputs=["token", "frame", "audio_capped"],
                engine="ar",
                fed_inputs=["reply_rows"],
                optional_inputs=["trailing", "reply_rows", "tts_eos", "audio_cap", "rope_positions"],
            ),
            GraphNode("code2wav", inputs=["codes"], outputs=["audio"]),
        ],
        edges=[
            GraphEdge("input.features", "audio_encoder.features"),
            GraphEdge("input.clip_frames", "audio_encoder.clip_frames"),
            GraphEdge("input.prompt_ids", "thinker.input_ids"),
            GraphEdge("input.embed_mask", "thinker.embed_mask"),
            GraphEdge("audio_encoder.embeds", "thinker.embeds"),
            GraphEdge("input.pixel_values", "vision_encoder.pixel_values"),
            GraphEdge("input.image_grid_thw", "vision_encoder.image_grid_thw"),
            GraphEdge("vision_encoder.embeds", "thinker.embeds"),
            GraphEdge("input.prompt_ids", "image_positions.prompt_ids"),
            GraphEdge("input.image_grid_thw", "image_positions.image_grid_thw"),
            GraphEdge("image_positions.rope_positions", "thinker.rope_positions"),
            # audio and images in one prompt: both encoders' rows in prompt order (media_prompt runs last
            # in its walk, so its value is the one the Thinker's embeds port holds)
            GraphEdge("input.prompt_ids", "media_prompt.prompt_ids"),
            GraphEdge("audio_encoder.embeds", "media_prompt.audio_embeds"),
            GraphEdge("vision_encoder.embeds", "media_prompt.image_embeds"),
            GraphEdge("media_prompt.embeds", "thinker.embeds"),
            GraphEdge("input.image_grid_thw", "talker_inputs.image_grid_thw"),
            GraphEdge("talker_inputs.rope_positions", "talker.rope_positions"),
            StreamingGraphEdge("input.pcm", "audio_frames.pcm", target_partition="thinker"),
            StreamingGraphEdge("audio_frames.log_mel", "audio_encoder.log_mel", target_partition="thinker"),
            GraphEdge("input.prompt_ids", "audio_prompt.prompt_ids"),
            GraphEdge("audio_encoder.embeds", "audio_prompt.embeds"),
            GraphEdge("audio_prompt.input_ids", "thinker.input_ids"),
            GraphEdge("audio_prompt.embed_mask", "thinker.embed_mask"),
            GraphEdge("audio_prompt.input_ids", "talker_inputs.prompt_ids"),
            # a streamed turn with images: their positions and the merged rows follow the widened prompt
            GraphEdge("audio_prompt.input_ids", "image_positions.prompt_ids"),
            GraphEdge("audio_prompt.input_ids", "media_prompt.prompt_ids"),
            GraphEdge("thinker.token", "thinker.input_ids"),
            GraphEdge("thinker.token", "output.text_ids"),
            GraphEdge("input.prompt_ids", "talker_inputs.prompt_ids"),
            GraphEdge("thinker.rows", "talker_inputs.rows"),
            GraphEdge("thinker.token", "talker_inputs.first_token"),
            # the reply's rows, as the Thinker makes them, into the Talker's running Loop
            StreamingGraphEdge("thinker.step_rows", "talker.reply_rows", target_partition="talker"),
            GraphEdge("input.say_ids", "talker_inputs.say_ids"),
            *(
                GraphEdge(f"talker_inputs.{p}", f"talker.{p}")
                for p in ("input_ids", "embeds", "embed_mask", "trailing", "tts_eos", "tts_pad", "audio_cap")
            ),
            GraphEdge("talker.token", "talker.input_ids"),  # the Loop's feedback (its row: Talker.feedback)
            GraphEdge("talker.frame", "output.codes"),
            GraphEdge("talker.audio_capped", "output.audio_capped"),  # [frames, text tokens]: the cap cut the audio
            StreamingGraphEdge("talker.frame", "code2wav.codes", target_partition="vocoder"),
            GraphEdge("code2wav.audio", "output.audio"),
        ],
        walks={
            "prefill_text": Call("thinker"),
            "prefill_stream": Sequential(AwaitInput("pcm"), Call("audio_prompt"), Call("thinker")),
            # the images are encoded while the turn is said; their positions wait for the widened prompt
            "prefill_stream_media": Sequential(
                Parallel(AwaitInput("pcm"), Call("vision_encoder")),
                Call("audio_prompt"),
                Call("image_positions"),
                Call("media_prompt"),
                Call("thinker"),
            ),
            "prefill_audio": Sequential(Call("audio_encoder"), Call("thinker")),
            "prefill_vision": Sequential(Call("vision_encoder"), Call("image_positions"), Call("thinker")),
            "prefill_media": Sequential(
                Call("audio_encoder"),
                Call("vision_encoder"),
                Call("image_positions"),
                Call("media_prompt"),
                Call("thinker"),
            ),
            "think": thinker_loop,
            "talk": Sequential(Call("talker_inputs"), talker_loop),
            # the Talker starts on the reply's first token and reads each later one as the Thinker makes it
            "think_and_talk": Sequential(Call("talker_inputs"), Parallel(thinker_loop, talker_loop)),
        },
        topology=PartitionTopology(
            partitions={
                "thinker": [
                    "audio_frames",
                    "audio_encoder",
                    "audio_prompt",
                    "vision_encoder",
                    "image_positions",
                    "media_prompt",
                    "thinker",
                ],
                "talker": ["talker_inputs", "talker"],
                "vocoder": ["code2wav"],
            },
            connections=[
                PartitionConnection("input", "thinker", LeftContextChunkPolicy(CHUNK_ITEMS, CONTEXT_ITEMS, edges=True)),
                PartitionConnection("thinker", "thinker", WholeStreamPolicy()),
                PartitionConnection("thinker", "talker", FixedChunkPolicy(1)),
                PartitionConnection("talker", "vocoder", LeftContextChunkPolicy(CHUNK_FRAMES, 0, first_chunk)),
            ],
        ),
        # features, clip_frames and embed_mask (or pcm) come with audio prompts only; pixel_values,
        # image_grid_thw and embed_mask with images
        required_inputs=("prompt_ids",),
        next_walk=walk_chooser(im_end),
    )
