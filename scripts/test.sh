#!/usr/bin/env bash
# One command for a fresh machine: set everything up, then run the whole test suite and the linters.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
export QT_QPA_PLATFORM=offscreen
.venv/bin/ruff check app tests scripts
.venv/bin/mypy app
.venv/bin/python -m pytest -q "$@"
