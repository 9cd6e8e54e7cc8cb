#!/usr/bin/env bash
# The package test (issue 37): builds the .deb and .tar.gz from BUILD_DIR,
# checks them (lintian: no errors; desktop-file-validate; appstreamcli
# validate), installs the .deb on this machine as the README says (apt-get
# install ./atelier_*.deb), then, with the source and build trees hidden (a
# private mount namespace with an empty tmpfs over the repository), runs the
# installed programs: --version, `models pull` of the default models from the
# fixtures mirror (the installed catalog), a story (checked against the
# fixtures' golden text) and a doodle, and the studio under Xvfb opening the
# doodle (a screenshot that must not be blank). Nothing may be written
# outside the test's home meanwhile. Last it purges the package and checks
# that nothing it installed is left (dpkg -L against the file system). The
# purge runs on every exit (trap). Needs root (dpkg).
# Usage: tests/package/deb_test.sh [BUILD_DIR]   (default: build)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
fixtures="$(cd "$repo/../shared/fixtures" && pwd)"
work="$(mktemp -d /tmp/atelier-deb-test.XXXXXX)"
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run as root (it installs and purges the package with dpkg)"
if dpkg-query -W -f='${Status}' atelier 2>/dev/null | grep -q "install ok installed"; then
  fail "a package named atelier is already installed here: remove it first (dpkg --purge atelier); this test will not replace it"
fi
for f in /usr/bin/atelier /usr/bin/atelier-serve /usr/bin/atelier-studio /usr/share/atelier; do
  [ ! -e "$f" ] || fail "$f exists and belongs to no package: this test would overwrite it"
done
installed=0
cleanup() {
  if [ "$installed" = 1 ]; then dpkg --purge atelier >/dev/null 2>&1 || echo "deb_test: could not purge atelier" >&2; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "-- cpack (DEB, TGZ)"
rm -f "$build"/atelier_*.deb "$build"/atelier_*.tar.gz
(cd "$build" && cpack -G DEB >/dev/null && cpack -G TGZ >/dev/null)
deb=$(ls "$build"/atelier_*_*.deb)
tgz=$(ls "$build"/atelier_*.tar.gz)
tar -tzf "$tgz" > "$work/tgz.txt"
for f in bin/atelier-studio lib/atelier/libatelier_cv.so share/atelier/catalog.json; do
  grep -qx "atelier_[^/]*/$f" "$work/tgz.txt" || fail "$tgz lacks $f"
done

echo "-- lintian"
lintian --tag-display-limit 0 "$deb" 2>&1 | grep -v 'running with root privileges' | tee "$work/lintian.txt" || true
! grep -q '^E: ' "$work/lintian.txt" || fail "lintian reports errors (above)"

echo "-- desktop-file-validate, appstreamcli validate"
desktop-file-validate "$repo/assets/org.atelier.Atelier.desktop"
appstreamcli validate --no-net "$repo/assets/org.atelier.Atelier.metainfo.xml"

echo "-- install ($deb)"
export DEBIAN_FRONTEND=noninteractive
installed=1
apt-get install -y -qq --no-install-recommends "$deb" >/dev/null
dpkg -L atelier > "$work/files.txt"
for f in /usr/bin/atelier /usr/bin/atelier-serve /usr/bin/atelier-studio /usr/lib/atelier/libatelier_cv.so /usr/share/atelier/catalog.json \
         /usr/share/atelier/clip/bpe_simple_vocab_16e6.txt.gz /usr/share/applications/org.atelier.Atelier.desktop \
         /usr/share/metainfo/org.atelier.Atelier.metainfo.xml /usr/share/icons/hicolor/scalable/apps/atelier.svg \
         /usr/share/icons/hicolor/256x256/apps/atelier.png /usr/share/man/man1/atelier.1.gz /usr/share/bash-completion/completions/atelier; do
  grep -qx "$f" "$work/files.txt" || fail "the package does not install $f"
done
desktop-file-validate /usr/share/applications/org.atelier.Atelier.desktop
appstreamcli validate --no-net /usr/share/metainfo/org.atelier.Atelier.metainfo.xml
man -l /usr/share/man/man1/atelier.1.gz 2>/dev/null | grep -q "batch" || fail "man atelier does not list the batch command"
bash -c 'source /usr/share/bash-completion/completions/atelier && COMP_WORDS=(atelier mo) COMP_CWORD=1 && _atelier && [ "${COMPREPLY[*]}" = models ]' ||
  fail "bash completion of 'atelier mo' is not 'models'"

echo "-- run the installed programs (source and build trees hidden)"
mkdir -p "$work/home"
touch "$work/marker"
sleep 1  # find -newer compares whole seconds on some file systems
cat > "$work/run.sh" <<INNER
set -euo pipefail
mount -t tmpfs none "$repo"   # the source tree, and the build tree inside it, are gone
[ ! -e "$repo/models/catalog.json" ]
cd "$work/home"
export HOME="$work/home" ATELIER_HOME="$work/home/data" XDG_CONFIG_HOME="$work/home/config"
unset ATELIER_CATALOG ATELIER_MODEL_MIRROR
[ "\$(atelier --version)" = "atelier $(cd "$repo" && sed -n 's/^project(atelier VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)" ]
atelier models pull stories260k quickdraw --mirror "$fixtures" >/dev/null
atelier text -m stories260k -p "Once upon a time" -n 60 --temp 0 --echo > story.txt 2>/dev/null
atelier image -m quickdraw -p airplane --seed 1 -o airplane.png 2>/dev/null
xvfb-run -a -s "-screen 0 1280x800x24" atelier-studio --screenshot "$work/studio.png" --screenshot-delay 4000 airplane.png 2>"$work/studio.err"
INNER
unshare -m bash "$work/run.sh" || { cat "$work/studio.err" 2>/dev/null; fail "the installed programs failed (above)"; }
cmp "$work/home/story.txt" "$fixtures/text/golden-once-upon-a-time-greedy.txt" || fail "the installed atelier's story differs from the golden text"
[ "$(head -c 8 "$work/home/airplane.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "airplane.png is not a PNG"
[ -s "$work/studio.png" ] || fail "the studio saved no screenshot"
colours=$(identify -format '%k' "$work/studio.png")
sd=$(identify -format '%[fx:standard_deviation]' "$work/studio.png")
echo "studio screenshot: $(identify -format '%wx%h' "$work/studio.png"), $colours colours, standard deviation $sd"
[ "$colours" -ge 50 ] || fail "the studio's screenshot is blank ($colours colours)"
awk -v s="$sd" 'BEGIN { exit !(s > 0.02) }' || fail "the studio's screenshot is blank (standard deviation $sd)"
[ -z "${ATELIER_DEB_TEST_SHOT:-}" ] || cp "$work/studio.png" "$ATELIER_DEB_TEST_SHOT"
written=$(find /usr /etc /opt /var/lib/atelier -xdev -newer "$work/marker" 2>/dev/null | grep -v '^/usr/local/lib/python' || true)
[ -z "$written" ] || fail "the programs wrote outside the user's folders: $written"

echo "-- purge"
dpkg --purge atelier >/dev/null
installed=0
left=()
while IFS= read -r p; do
  [ -e "$p" ] || continue
  [ "$p" = "/." ] && continue
  if [ -d "$p" ] && dpkg -S "$p" >/dev/null 2>&1; then continue; fi  # a folder other packages own too (/usr/share/man/man1)
  left+=("$p")
done < "$work/files.txt"
[ ${#left[@]} -eq 0 ] || fail "left after the purge: ${left[*]}"
echo "deb_test: OK ($(wc -l < "$work/files.txt") paths installed and removed)"
