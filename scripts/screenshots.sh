#!/usr/bin/env bash
# Start FitScope on a virtual X display (xvfb), drive it to a few views and save PNGs.
#   scripts/screenshots.sh [OUTPUT_DIR] [--presentation-only]   (default: docs/screenshots)
# Needs Xvfb: on Debian/Ubuntu, `sudo apt-get install xvfb`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
if ! command -v xvfb-run > /dev/null; then
    echo "screenshots: xvfb-run not found; install it with: sudo apt-get install xvfb" >&2
    exit 2
fi
cd "$root"
unset QT_QPA_PLATFORM
out="docs/screenshots"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then out="$1"; shift; fi
xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshots.py "$out" "$@"
if [ "${1:-}" = "--presentation-only" ]; then exit 0; fi
exec xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshot_remote.py "$out"
