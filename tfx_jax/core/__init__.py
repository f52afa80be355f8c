"""Floor 0: what every other floor uses (errors, atomic files, typed config
sections, shared flag handling, preemption). Imports nothing of tfx_jax.
"""
