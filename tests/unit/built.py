"""What the tests of every compiled twin check of its build."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOTS = ("handlers/_slots.pyx", "handlers/_slots.pxd")
"""The slot access every compiled module but the parser's and the partitioner's takes in."""


def optional(name: str) -> tuple[Any, pytest.MarkDecorator]:
    """The compiled module ``name`` (None when it is not built: no C compiler at
    install), and a marker that skips a test needing it, saying why."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        module = None
    reason = f"{name} is not built (no C compiler?): pip install -e . builds it"
    return module, pytest.mark.skipif(module is None, reason=reason)


def assert_built_after(extension: ModuleType | None, *sources: str) -> None:
    """An edit to ``sources`` (paths from the repository's root) takes effect only once
    the extension is built again: fail when one is newer than the built file. A source
    that is not there (an installed wheel carries none to edit) is skipped."""
    assert extension is not None, "not built: pip install -e . builds the extensions"
    built = Path(str(extension.__file__)).stat().st_mtime
    for name in sources:
        source = ROOT / name
        if source.exists():
            assert built >= source.stat().st_mtime, (
                f"{name} changed since the extension was built: pip install -e ."
            )


def private(module: ModuleType, name: str) -> Any:
    """``module``'s own ``name``: a name it imported for itself (a compiled twin, or the
    reference it falls back to), which mypy does not let another module read as an
    attribute. Read at each call, so that what a test patches in is what it gets."""
    return vars(module)[name]
