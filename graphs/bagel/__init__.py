"""BAGEL-7B-MoT (ByteDance-Seed): SigLIP NaViT + Qwen2 MoT LLM + FLUX VAE, unified understanding and generation."""
