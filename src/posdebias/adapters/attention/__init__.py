"""Everything registered with transformers' attention interface.

One attention function (``posdebias_probe``) serves three behaviours: SoFA's mask
(:mod:`~posdebias.adapters.attention.sofa`), several samples decoding over one shared copy of the
prompt (:mod:`~posdebias.adapters.attention.shared_prefix`) and the attention probe
(:mod:`~posdebias.adapters.attention.probe`). Each is inactive (the call is plain SDPA) unless
its context manager is entered.
"""
