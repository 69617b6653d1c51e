"""The two test layers, checked while the tests run (a pytest plugin registered by conftest).

A test is in the **integration** layer when it carries ``pytest.mark.integration`` (a module's
``pytestmark`` or its own mark; ``multiprocess`` implies it). Every other test is a **unit**
test, and a unit test must not use what makes a test an integration test:

- a ``torch.distributed`` process group in this process (real megatron-core training),
- a process started by ``multiprocessing`` (the launcher's multi-rank gloo trainings),
- a subprocess that trains, parses with Megatron-LM's own code or drives a browser: a script
  of ``tests/``, ``memscope demo``, torchrun, chromium, or one given a FlagScale tree,
- a file of a FlagScale tree, or a copy of one (a folder named ``flag_scale``, as the cached
  tree and its copies are).

Those uses are seen as they happen (a Python audit hook for files and subprocesses; call-through
wrappers on ``init_process_group`` and ``BaseProcess.start`` that only record and then call the
real function). A unit test that used one, in its own body or in setting up a fixture it
depends on (also one set up earlier for another test), fails with what it used and the mark to
add, so ``-m "not integration"`` (the quick subset) never trains.
"""

from __future__ import annotations

import functools
import multiprocessing.process
import os
import sys
from collections.abc import Generator, Sequence
from typing import Any

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = "integration"
#: Marks that put a test in the integration layer.
INTEGRATION_MARKS = (INTEGRATION, "multiprocess")
_TREE_DIR = "flag_scale"  # the FlagScale tree's root folder (cache and copies alike)
_BROWSERS = ("chromium", "chromium-browser", "chrome", "google-chrome")
_INSTALLED = False


def in_flagscale_tree(path: object, root_too: bool = False) -> bool:
    """Whether ``path`` lies inside a FlagScale source tree (a folder named ``flag_scale``),
    or with ``root_too`` is also the tree's folder itself. Opening the folder alone is not
    using the tree: ``shutil.rmtree`` opens each folder it removes by its bare name."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or _TREE_DIR not in path:
        return False
    parts = os.path.normpath(path).split(os.sep)
    return _TREE_DIR in (parts if root_too else parts[:-1])


def integration_command(argv: Sequence[object]) -> str | None:
    """Why the command ``argv`` makes a test an integration test, or None when it does not."""
    args = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
    if not args:
        return None
    names = [os.path.basename(a) for a in args]
    if names[0] in _BROWSERS:
        return f"a real browser ({names[0]})"
    if names[0] == "torchrun" or "torch.distributed.run" in args:
        return "a torchrun launch"
    if "demo" in args[1:] and any("memscope" in a for a in args[: args.index("demo")]):
        return "`memscope demo` (trains a GPT)"
    for arg in args[1:]:
        full = os.path.abspath(arg)
        if arg.endswith(".py") and os.path.dirname(full) == TESTS_DIR:
            return f"the worker script tests/{os.path.basename(full)} in a subprocess"
        if in_flagscale_tree(arg, root_too=True):
            return "a subprocess given a FlagScale tree"
    return None


class LayerGuard:
    """Records integration resources used during each test phase and fixture setup, and
    fails a unit test that used one."""

    def __init__(self) -> None:
        self.used: list[str] = []  # what this phase used, in order, without repeats
        self.fixtures: dict[str, str] = {}  # fixture name -> what its setup used

    # -- recording ------------------------------------------------------------------------
    def note(self, what: str) -> None:
        if what not in self.used:
            self.used.append(what)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """sys.addaudithook callback: must be cheap and must never raise."""
        try:
            if event in ("open", "shutil.copytree"):  # a file in a tree; a tree copied
                if in_flagscale_tree(args[0], root_too=event != "open"):
                    self.note("the FlagScale tree")
            elif event == "subprocess.Popen":
                argv = args[1]
                argv = [argv] if isinstance(argv, str | bytes) else list(argv or [])
                why = integration_command(argv)
                if why is None and len(args) > 2 and in_flagscale_tree(args[2], root_too=True):
                    why = "a subprocess run in a FlagScale tree"
                if why:
                    self.note(why)
        except Exception:  # an audit hook that raises would break the audited call
            pass

    def install(self, process_groups: bool = True) -> None:
        """Start watching (audit hooks cannot be removed: one guard per process);
        ``process_groups=False`` leaves torch unimported (the guard's own toy runs)."""
        global _INSTALLED
        assert not _INSTALLED, "one layer guard per process"
        _INSTALLED = True
        sys.addaudithook(self.audit)
        start = multiprocessing.process.BaseProcess.start

        @functools.wraps(start)
        def recording_start(process: Any) -> None:
            self.note("a second process (multiprocessing)")
            start(process)

        multiprocessing.process.BaseProcess.start = recording_start  # type: ignore[method-assign]
        if not process_groups:
            return
        import torch.distributed as dist

        init = dist.init_process_group

        @functools.wraps(init)
        def recording_init(*args: Any, **kwargs: Any) -> Any:
            self.note("a torch.distributed process group (training in this process)")
            return init(*args, **kwargs)

        dist.init_process_group = recording_init  # type: ignore[assignment]

    # -- pytest hooks ----------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:  # multiprocess implies integration (before -m deselects)
            if item.get_closest_marker("multiprocess") and not item.get_closest_marker(INTEGRATION):
                item.add_marker(INTEGRATION)

    def pytest_runtest_logstart(self) -> None:
        self.used = []  # what ran between tests (collection: imports) is no test's use

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Generator[None, None, None]:
        before = len(self.used)
        yield
        if len(self.used) > before:
            self.fixtures.setdefault(fixturedef.argname, self.used[before])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        used, self.used = self.used, []
        if call.when == "teardown" or is_integration(item):
            return
        names = getattr(item, "fixturenames", ())
        for name in names:
            if name in self.fixtures:
                used.append(f"the fixture {name!r} ({self.fixtures[name]})")
        report = outcome.get_result()
        if used and not report.skipped:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} is a unit test but used {'; '.join(used)}: mark it "
                "integration (`pytestmark = pytest.mark.integration` in its module, or "
                "@pytest.mark.integration on the test) or make it use none (tests/layer_guard.py)"
            )


def is_integration(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in INTEGRATION_MARKS)
