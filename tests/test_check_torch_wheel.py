"""tools/check_torch_wheel.py on a small wheel-shaped zip: what it reports present and what
missing (the real check ran on torch 2.7.1's wheel: benchmarks/torch_2.7.1_apis.txt)."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.join(Path(__file__).resolve().parent.parent, "tools"))
import check_torch_wheel as tool

MEMORY = """
def _record_memory_history(enabled="all", *args, **kwargs): ...
def _record_memory_history_impl(enabled="all", context="all", stacks="all"): ...
def _snapshot(device=None): ...
def _dump_snapshot(filename="x"): ...
def memory_stats(device=None): ...
def reset_peak_memory_stats(device=None): ...
"""


TENSOR = "class Tensor:\n    def register_post_accumulate_grad_hook(self, hook): ...\n"
MODULE = """
class Module:
    def register_forward_hook(self, hook, *, with_kwargs=False, always_call=False): ...
    def register_forward_pre_hook(self, hook, *, with_kwargs=False): ...
"""
DISPATCH = """
class TorchDispatchMode:
    def __torch_dispatch__(self, func, types, args=(), kwargs=None): ...
"""


def _wheel(tmp_path: Path, library: bytes) -> str:
    path = tmp_path / "torch-0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("torch/cuda/memory.py", MEMORY)  # no mem_get_info, no max_entries
        zf.writestr("torch/_tensor.py", TENSOR)
        zf.writestr("torch/nn/modules/module.py", MODULE)
        zf.writestr("torch/utils/_python_dispatch.py", DISPATCH)
        zf.writestr("torch/_C/__init__.pyi", "def _current_graph_task_id() -> int: ...\n")
        zf.writestr("torch/lib/libtorch_python.so", library)
    return str(path)


def test_missing_functions_keywords_and_bindings_are_named(tmp_path, capsys):
    wheel = _wheel(tmp_path, b"\0nothing here\0")
    problems = {api: why for api, why in tool.check(wheel) if why}
    assert problems == {
        "torch/cuda/memory.py:_record_memory_history_impl": "takes no max_entries",
        "torch/cuda/memory.py:mem_get_info": "not defined",
        "torch._C._cuda_attach_out_of_memory_observer": "not compiled in",
    }
    assert tool.main([wheel]) == 1
    assert "10 of 13 APIs present" in capsys.readouterr().out


def test_a_binding_compiled_into_the_library_counts(tmp_path):
    wheel = _wheel(tmp_path, b"\0_cuda_attach_out_of_memory_observer\0")
    assert dict(tool.check(wheel))["torch._C._cuda_attach_out_of_memory_observer"] is None
