"""``python -m tests.without_extensions ARGS``: limitflow's command line as installed
without a C compiler. Every compiled twin (``*/_*.pyx``, ``setup.py``'s extensions) is
refused at import, so that the Python each one falls back to runs instead; at the end,
a last line on stderr names the compiled modules that loaded all the same:
``compiled:`` and nothing more when none did.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = frozenset(
    ".".join(path.relative_to(ROOT).with_suffix("").parts) for path in ROOT.glob("*/_*.pyx")
)


class NoExtensions:
    """A finder that refuses the compiled twins, as a missing build would."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in EXTENSIONS:
            raise ModuleNotFoundError(f"No module named {name!r} (as without a C compiler)")


def main() -> int:
    sys.meta_path.insert(0, NoExtensions())
    from limitflow.__main__ import main as limitflow

    try:
        return limitflow()
    finally:
        print("compiled:", *sorted(EXTENSIONS & set(sys.modules)), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
