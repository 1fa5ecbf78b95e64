"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from handlers import decide


@pytest.fixture(scope="module", params=["compiled", "python"])
def both_cores(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module's tests on the compiled payment path, then on the Python path alone
    (as on a machine where the extension could not be built)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "python":
            patch.setattr(decide, "_fastcore", None)
        yield request.param
