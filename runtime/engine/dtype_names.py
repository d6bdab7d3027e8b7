"""The dtype names a config, a launch argument or ``--dtype`` may give (no torch import: parsers use it)."""

#: ``auto``: the fastest dtype the device runs natively (mstar.engine.dtype_choice)
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
