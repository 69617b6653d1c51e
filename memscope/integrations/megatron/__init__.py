"""Megatron-LM / FlagScale integration: the runtime tracer and its argument provider."""

from memscope.integrations.megatron.args import (
    add_memscope_args,
    compose_args_providers,
    parse_bool,
)
from memscope.integrations.megatron.runtime import MemScopeMegatronRuntime

__all__ = [
    "MemScopeMegatronRuntime",
    "add_memscope_args",
    "compose_args_providers",
    "parse_bool",
]
