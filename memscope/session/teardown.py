"""A stack of undo actions: whatever a session installs is removed in reverse order."""

from __future__ import annotations

from collections.abc import Callable


class Teardown:
    """Undo actions pushed as things are installed; :meth:`unwind` runs them newest first.

    Each action runs even if an earlier one failed; a failure goes to ``on_error`` (the
    session's failure log) and never propagates.
    """

    def __init__(self) -> None:
        self._actions: list[tuple[str, Callable[[], object]]] = []

    def push(self, site: str, action: Callable[[], object]) -> None:
        """Remember to run ``action`` (named ``site`` in failure reports) at unwind."""
        self._actions.append((site, action))

    def unwind(self, on_error: Callable[[str, BaseException], None]) -> list[str]:
        """Run every action, newest first; returns the sites in the order they ran."""
        ran = []
        while self._actions:
            site, action = self._actions.pop()
            ran.append(site)
            try:
                action()
            except Exception as exc:
                on_error(site, exc)
        return ran

    def __len__(self) -> int:
        return len(self._actions)
