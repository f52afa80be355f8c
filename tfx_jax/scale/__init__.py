"""Scale planning: what a run needs of the hardware it is meant for.

``topology`` names the machines (Cloud TPU slices, fake CPU devices) and makes
their devices; ``chips`` holds each accelerator's published peaks; ``flops``
is the analytic model FLOP count; ``hlo`` reads a compiled program's own
work, traffic and collectives; ``roofline`` turns them into a step time and
MFU estimate. ``python -m tfx_jax.compile`` puts them together.
"""
