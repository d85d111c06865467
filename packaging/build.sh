#!/usr/bin/env bash
# Build the self-contained Linux app folder (dist/FitScope) and its tarball with PyInstaller, print
# the bundle's size and start-up time, and smoke-test it. About a minute and a half on 2 cores;
# kept out of the test command for that reason.
#   packaging/build.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/bootstrap.sh
.venv/bin/python -m pip install --quiet "pyinstaller>=6.10,<7"
.venv/bin/python -m PyInstaller packaging/fitscope.spec --noconfirm --distpath dist --workpath build/pyinstaller \
    --log-level WARN
arch="$(uname -m)"
tarball="dist/FitScope-$(.venv/bin/python -c 'import app; print(app.__version__)')-linux-$arch.tar.gz"
tar -czf "$tarball" -C dist FitScope
echo "bundle: dist/FitScope ($(du -sh dist/FitScope | cut -f1)), tarball: $tarball ($(du -sh "$tarball" | cut -f1))"
packaging/smoke_test.sh dist/FitScope/fitscope
.venv/bin/python scripts/bench_startup.py --runs 3 --exe dist/FitScope/fitscope
