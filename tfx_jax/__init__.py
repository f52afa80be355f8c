"""tfx_jax: Transformer ablations in JAX/Flax."""

from tfx_jax.core import host as _host

# libtpu installed (the tpu-aot extra) on a machine without a TPU: keep JAX
# from starting a TPU backend in every command (core/host.py).
_host.skip_absent_tpu()
