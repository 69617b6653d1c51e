"""Readers of what users hand MemScope: Megatron args, config files (FlagScale YAML, MemScope
JSON), FlagScale experiments, hostfiles, a run's model facts and training logs.

Torch-free. Turns them into plain records and the estimator's typed spec
(:class:`memscope.analysis.static.config.TrainingSpec`); analysis never imports this layer
and reads no file itself (see docs/architecture.md).
"""
