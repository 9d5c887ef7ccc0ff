"""Thin writers that store a training run's outputs in forgetkit's format, epoch by epoch.

Import the one you need: ``forgetkit.exporters.torch`` (PyTorch, optional PyTorch Lightning)
or ``forgetkit.exporters.jax`` (JAX / Flax-style ``apply_fn``). Neither framework is imported
by ``import forgetkit``; install them with ``pip install forgetkit[torch]`` or ``[jax]``.
"""
