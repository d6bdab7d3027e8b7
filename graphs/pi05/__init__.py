"""pi0.5 (openpi): SigLIP image encoder node, Gemma prefix LM + adaRMS action expert AR module.

config (Pi05Config) - siglip (Pi05ImageEncoder) - gemma / expert / pi05 (Pi05Model) -
prompt (build_prefix) - checkpoints (name maps, cached tiny checkpoint) - tiny (generator) -
reference (dense recompute-every-step sampling).
"""
