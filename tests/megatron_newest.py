"""Which tests CI runs a second time on the newest megatron-core (a pytest plugin registered by
conftest): every test marked ``megatron_versions`` (``pytest -m megatron_versions``, the second
run of ``.ci/run``).

Besides the tests marked so in their modules (the version terms, which include unit tests),
every **integration** test is marked, since nearly all of them train or build the installed
megatron-core's modules, except those in :data:`NOT_INSTALLED_MEGATRON`: they exercise no
installed megatron-core (FlagScale's tree brings its own Megatron-LM, a browser reads committed
reports, the planner's search is the static estimator alone), so a second run would repeat the
first. Entries are a test module's file name, or ``file::test function``.
"""

from __future__ import annotations

import pytest

MARK = "megatron_versions"
#: Integration tests that run no installed megatron-core, with why.
NOT_INSTALLED_MEGATRON: dict[str, str] = {
    "test_patched_train_step.py": "FlagScale 0.8.0's patched train_step on its bundled "
    "Megatron-LM 0.15 (its own megatron.core)",
    "test_patches.py": "patches applied to FlagScale's bundled Megatron-LM",
    "test_flagscale_config.py": "FlagScale's own training script and its bundled Megatron-LM",
    "test_flagscale_autotuner.py": "FlagScale's auto-tuner from its tree",
    "test_html_browser.py": "a browser on reports, no training",
    "test_planner.py::test_a_published_recipe_ranks_in_the_top_3_or_the_term_that_beats_it"
    "_is_named": "the planner's search over published recipes: the static estimator only (its "
    "version terms are checked on explicit releases in test_static_megatron_versions.py)",
}


def excluded(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``tests/test_x.py::test_y[param]``) is in
    :data:`NOT_INSTALLED_MEGATRON`."""
    path, _, rest = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1]
    function = rest.split("[", 1)[0]
    return name in NOT_INSTALLED_MEGATRON or f"{name}::{function}" in NOT_INSTALLED_MEGATRON


class NewestMegatronSelection:
    """Marks every integration test not excluded ``megatron_versions``."""

    @pytest.hookimpl(tryfirst=True)  # before -m deselects (multiprocess counts as integration)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        from layer_guard import is_integration

        for item in items:
            marked = item.get_closest_marker(MARK) is not None
            if is_integration(item) and not excluded(item.nodeid) and not marked:
                item.add_marker(MARK)
