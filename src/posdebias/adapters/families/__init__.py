"""The built-in model families: one module each (a family that differs from a sibling only in
data shares its module: the text-only families ``text``, Qwen3-VL, Qwen3.5 and PaddleOCR-VL
``qwen2_vl``, LLaVA-NeXT and LLaVA-OneVision ``llava``, Qwen3-Omni-MoE ``qwen2_5_omni``),
holding the adapter classes and their hookimpl.

The registry loads them by module name (``posdebias.registry.manager.BUILTIN_PLUGINS``); their
tiny test models live in :mod:`posdebias.testing.tiny`.
"""
