#!/usr/bin/env bash
# Add FitScope to this user's application menu: the .desktop entry and the icons, under
# ~/.local/share (no root needed). It launches this checkout's .venv/bin/fitscope, or the bundle
# given as the first argument (e.g. dist/FitScope/fitscope).
#   packaging/install-desktop.sh [PATH_TO_FITSCOPE]       packaging/install-desktop.sh --uninstall
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
share="${XDG_DATA_HOME:-$HOME/.local/share}"
apps="$share/applications"
icons="$share/icons/hicolor"
if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$apps/fitscope.desktop" "$icons"/*/apps/fitscope.png "$icons/scalable/apps/fitscope.svg"
    echo "FitScope removed from the application menu."
    exit 0
fi
exe="${1:-$root/.venv/bin/fitscope}"
if [ ! -x "$exe" ]; then
    echo "install-desktop: $exe is not an executable; run ./scripts/bootstrap.sh first or give the bundle's path" >&2
    exit 2
fi
exe="$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")"
mkdir -p "$apps" "$icons/scalable/apps"
for png in "$root"/resources/icons/fitscope-*.png; do
    size="$(basename "$png" .png)"; size="${size#fitscope-}"
    mkdir -p "$icons/${size}x${size}/apps"
    cp "$png" "$icons/${size}x${size}/apps/fitscope.png"
done
cp "$root/resources/icons/fitscope.svg" "$icons/scalable/apps/fitscope.svg"
sed "s|^Exec=fitscope |Exec=\"$exe\" |" "$root/resources/fitscope.desktop" > "$apps/fitscope.desktop"
chmod 644 "$apps/fitscope.desktop"
command -v update-desktop-database > /dev/null && update-desktop-database "$apps" || true
command -v gtk-update-icon-cache > /dev/null && gtk-update-icon-cache -q -t "$icons" || true
echo "FitScope added to the application menu ($apps/fitscope.desktop -> $exe)."
