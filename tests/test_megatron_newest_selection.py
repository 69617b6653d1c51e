"""tests/megatron_newest.py: which tests CI's second run (the newest megatron-core) selects."""

from __future__ import annotations

import ast
import os

import pytest
from megatron_newest import MARK, NOT_INSTALLED_MEGATRON, NewestMegatronSelection, excluded

TESTS = os.path.dirname(os.path.abspath(__file__))


def _functions(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("entry", sorted(NOT_INSTALLED_MEGATRON))
def test_every_exclusion_names_a_test_that_exists(entry):
    name, _, function = entry.partition("::")
    path = os.path.join(TESTS, name)
    assert os.path.isfile(path), entry
    assert not function or function in _functions(path), entry
    assert NOT_INSTALLED_MEGATRON[entry], "each exclusion says why"


def test_exclusions_match_whole_modules_and_parametrised_functions():
    planner = "test_a_published_recipe_ranks_in_the_top_3_or_the_term_that_beats_it_is_named"
    assert excluded("tests/test_html_browser.py::test_markup_in_names_reaches_plotly_as_text")
    assert excluded(f"tests/test_planner.py::{planner}[DeepSeek-V3]")
    assert not excluded("tests/test_planner.py::test_the_top_plan_trains_within_the_budget")
    assert not excluded("tests/test_runtime_multiprocess.py::test_x[pp2]")


class _Item:
    """What the hook reads and writes of a pytest item."""

    def __init__(self, nodeid: str, *marks: str) -> None:
        self.nodeid, self.marks = nodeid, set(marks)

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.marks else None

    def add_marker(self, name: str) -> None:
        self.marks.add(name)


def test_the_newest_run_selects_integration_tests_not_excluded():
    items = {
        "unit": _Item("tests/test_static_params.py::test_a"),
        "integration": _Item("tests/test_static_terms.py::test_b", "integration"),
        "multiprocess": _Item("tests/test_static_muon.py::test_c", "multiprocess"),
        "browser": _Item("tests/test_html_browser.py::test_d", "integration"),
        "version term": _Item("tests/test_static_megatron_versions.py::test_e", MARK),
    }
    hook = NewestMegatronSelection().pytest_collection_modifyitems
    hook(list(items.values()))  # type: ignore[arg-type]  # (stand-ins for pytest items)
    selected = {k for k, item in items.items() if MARK in item.marks}
    assert selected == {"integration", "multiprocess", "version term"}
