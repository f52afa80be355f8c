"""Logical axis names: what each parameter and activation dimension is called.

Parameters carry logical axis names (``embed``, ``mlp``, ``heads``, ``kv``,
``vocab``, ``layers``, ``expert``, ...); ``LOGICAL_RULES`` maps them to the
mesh axes ``data`` (batch), ``fsdp`` (parameters sharded, batch too),
``tensor`` (within-layer model parallelism) and ``expert`` (the experts of a
mixture of experts, model/layers/moe.py; outside the experts it shards the
batch, as MaxText's expert axis does, so that no device repeats another's
work). The mesh itself is built by ``run/sharding.py``.
"""

MESH_AXES = ("data", "fsdp", "tensor", "expert")
BATCH_AXES = ("data", "fsdp", "expert")

LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    # MLA's latents (model/layers/mla.py): d_c and d_c' are small; replicated.
    ("latent", None),
    ("vocab", "tensor"),
    ("layers", None),
    ("max_len", None),
    ("relpos_buckets", None),
    ("classes", None),
    ("embed_out", None),
    ("expert", "expert"),
)
