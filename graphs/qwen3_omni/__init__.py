"""Qwen3-Omni: the Thinker (MoE LLM with its audio and vision encoders), the Talker with its code
predictor, and Code2Wav, matching transformers' Qwen3OmniMoeForConditionalGeneration.

Every model folder has the same skeleton:

- ``graph.py``: the Walk Graph (Thinker -> Talker -> Code2Wav, text and audio out);
- ``components.py``: what a Worker builds (``qwen3_omni_components``, the ``mstar.models`` entry point);
- ``config.py``: ``Qwen3OmniConfig`` (``config_aliases.py``: transformers' other field names);
- ``checkpoints.py``: each component's weights from transformers' layout, and the cached generated checkpoint;
- ``tiny.py``: the generated checkpoint;
- ``frontend.py``: the user-facing API, ``Qwen3OmniChat`` (the ``mstar.speech_models`` entry point).

The rest: ``model.py`` (Qwen3OmniModel: graph, submodules, requests), ``thinker.py`` / ``talker.py`` /
``code_predictor.py`` / ``decoder.py`` / ``moe.py`` (on graphs/common's layers), ``tensor_parallel.py``,
``audio_*.py`` / ``vision_encoder.py`` / ``image_*.py`` (the encoders and their inputs), ``chat.py``
(prompts), ``talker_*.py``, ``code2wav*.py``, ``mrope_positions.py``, ``direct.py`` (one process,
dense caches: the yardstick) and ``reference.py`` (transformers).
"""
