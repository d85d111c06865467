#!/usr/bin/env bash
# One command for a fresh machine: set everything up, then start FitScope on the built-in demo model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
if [ "$#" -eq 0 ]; then
    set -- window --demo  # the window, on the built-in demo model
fi
exec "$root/.venv/bin/fitscope" "$@"
