"""The one reader of Megatron-LM's test recipes (``bench_static_gpu_golden.read_recipes``),
which both static benchmarks use for a case's world size."""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
)
import bench_static_gpu_golden as bench


def test_recipes_give_a_case_the_world_size_of_the_recipe_that_runs_it():
    """A DGX recipe beats a GB200 one, a listing beats a commented-out entry elsewhere, and a
    case that is only commented out is flagged (the tree benchmark leaves it out)."""
    dgx = "spec: {nodes: 1, gpus: 8}\nproducts:\n  - test_case: [a]\n  # - test_case: [b]\n"
    # a GB200 recipe's script exports its gpus as GPUS_PER_NODE (a DGX one launches 8 a node)
    gb200 = (
        "spec:\n  nodes: 1\n  gpus: 4\n  script: |\n    export GPUS_PER_NODE={gpus}\n"
        "products:\n  - test_case: [a, b, c]\n"
    )
    commented = "spec: {nodes: 4, gpus: 8}\nproducts:\n  # - test_case: [c]\n  # - test_case: [d]\n"
    files = [("r/gb200.yaml", gb200), ("r/dgx.yaml", dgx), ("r/more.yaml", commented)]
    assert bench.read_recipes(files) == {
        "a": (8, "r/dgx.yaml", False),
        "b": (4, "r/gb200.yaml", False),
        "c": (4, "r/gb200.yaml", False),
        "d": (32, "r/more.yaml", True),
    }
