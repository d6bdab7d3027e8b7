"""Qwen3-Omni: the Thinker (MoE LLM with its audio encoder), the Talker with its code predictor, and
Code2Wav, matching transformers' Qwen3OmniMoeForConditionalGeneration (see ``direct.py`` for the
whole model end to end; the serving graph is being built)."""
