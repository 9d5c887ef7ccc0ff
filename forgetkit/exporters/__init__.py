"""Thin writers that store a training run's outputs in forgetkit's format, epoch by epoch.

Import the one you need: ``forgetkit.exporters.torch`` (PyTorch, a PyTorch Lightning
callback; torch.distributed: each rank evaluates its shard, rank 0 writes),
``forgetkit.exporters.huggingface`` (a ``transformers.TrainerCallback``),
``forgetkit.exporters.keras`` (a Keras 3 callback, any backend) or ``forgetkit.exporters.jax``
(JAX / Flax-style ``apply_fn``, outputs sharded over devices). No framework is imported by
``import forgetkit``; install them with ``pip install forgetkit[torch]``, ``[lightning]``,
``[huggingface]``, ``[keras]`` or ``[jax]``.

Every recorder can store the full outputs or their summary (``summary=True``, see
`forgetkit.summarize`), and writes on a background thread (`forgetkit.io.background`); they
share one set of options (`forgetkit.exporters._common.RecorderOptions`).

A finished training that recorded nothing is replayed from its saved checkpoints:
``forgetkit.exporters.torch.replay`` (state dicts, Lightning checkpoints, safetensors),
``forgetkit.exporters.huggingface.replay`` (a Trainer's ``checkpoint-N`` folders) and
``forgetkit.exporters.keras.replay`` write the run the recorder would have written.
"""
