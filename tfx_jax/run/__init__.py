"""Floor 4: one run (its config and resolution, setup, the training loop,
optimizers, sharding, distributed start, checkpoints, metrics, layer
statistics, a trained run, scoring and the evaluation library).
"""
