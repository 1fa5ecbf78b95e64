#!/usr/bin/env bash
# The project's one test command (README and CI run exactly this): sets up .venv with
# the project and its dev tools, installs the real test servers into .servers/, then
# runs lint, formatting, type checks and the whole test suite against real servers.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON_FOR_VENV:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,faust]'
bash scripts/install-test-servers.sh

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
