#!/usr/bin/env bash
# Retakes the AppStream screenshots (write.png, paint.png here) of the real
# studio under Xvfb: a fresh home with the default models from the fixtures
# mirror, a QuickDraw doodle opened in Paint (its parameters restored), and Write.
# Usage: assets/screenshots/take.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
export HOME="$t" ATELIER_HOME="$t/home" XDG_CONFIG_HOME="$t/config"
mkdir -p "$ATELIER_HOME/images"
"$build/app/atelier" models pull stories260k quickdraw --mirror "$here/../../../shared/fixtures" >/dev/null
"$build/app/atelier" image -m quickdraw -p airplane --seed 1 -o "$ATELIER_HOME/images/airplane.png" 2>/dev/null
shot() { xvfb-run -a -s "-screen 0 1280x800x24" "$build/ui/atelier-studio" --screenshot "$1" --screenshot-delay 5000 "${@:2}" 2>/dev/null; }
shot "$here/paint.png" "$ATELIER_HOME/images/airplane.png"
shot "$here/write.png"
