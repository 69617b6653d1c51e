"""Concurrent test runs never share pytest's temporary base (tests/conftest.py)."""

from __future__ import annotations

import os
import tempfile

from conftest import session_basetemp


def test_each_session_without_basetemp_gets_a_fresh_folder_of_its_own():
    first, second = session_basetemp(None), session_basetemp(None)
    try:
        assert first != second
        for folder in (first, second):
            assert os.path.isdir(folder) and not os.listdir(folder)
            assert os.path.dirname(folder) == tempfile.gettempdir()
            assert os.path.basename(folder).startswith("memscope-tests-")
    finally:
        os.rmdir(first)
        os.rmdir(second)


def test_a_given_basetemp_is_kept():
    assert session_basetemp("/somewhere/chosen") == "/somewhere/chosen"


def test_this_session_does_not_use_pytests_shared_per_user_folder(tmp_path_factory):
    assert "pytest-of-" not in str(tmp_path_factory.getbasetemp())
