"""Readers of what users hand MemScope: training logs (and, in time, configs and hostfiles).

Torch-free. Turns files into plain records and the estimator's typed spec; analysis never
imports this layer (see docs/architecture.md).
"""
