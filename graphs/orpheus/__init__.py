"""Orpheus TTS: a Llama LLM that speaks in SNAC codes, and the SNAC 24 kHz decoder that turns them into audio.

Every model folder has the same skeleton:

- ``graph.py``: the Walk Graph (LLM -> SNAC stage);
- ``components.py``: what a Worker builds (``orpheus_components``, the ``mstar.models`` entry point);
- ``config.py``: the LLM's ``LlamaConfig`` (``snac_config.py``: the codec's);
- ``checkpoints.py``: where weights come from (a directory, or the cached generated one);
- ``tiny.py``: the generated checkpoint (``tiny_llm.py``, ``tiny_snac.py``: its two parts);
- ``frontend.py``: the user-facing API, ``OrpheusTTS`` (the ``mstar.speech_models`` entry point).

The rest: ``llama.py`` (the LLM on graphs/common's layers), ``prompt.py`` and ``tokens.py`` (text in,
audio tokens out), ``snac_*.py`` (the decoder and its streaming stage), ``reference.py``
(transformers + the snac package, for parity tests and benchmarks).
"""
