"""The model-agnostic shelf the model folders build on (M*'s ``model/components``).

``attention.py`` (GQAttention), ``mlp.py`` (GatedMLP), ``rms_norm.py`` (RMSNorm, GemmaRMSNorm),
``decoder_layer.py`` (PreNormDecoderLayer), ``fused_linear.py``, ``rope.py``: the decoder layers of
Llama, Gemma and Qwen with options for what they differ in. ``config_loader.py``: ConfigError and the
config.json reader every model's ``config.py`` uses. ``cache.py``: generated fixtures on disk;
``tokenizer_file.py``: a checkpoint's tokenizer.json.
"""
