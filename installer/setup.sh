#!/usr/bin/env bash
# Installs every Debian 12 package that Atelier's build, tests and app need.
# Idempotent: a no-op (no apt-get call at all) when everything is present.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build ccache pkg-config
  # engine
  libsqlite3-dev libssl-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libicu-dev
  libcurl4-openssl-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libopencv-core-dev libopencv-imgproc-dev
  # the HTTP API (app/server)
  libcpp-httplib-dev
  # tests and benchmarks (prometheus: promtool checks /metrics)
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  # ui
  qt6-base-dev libgl-dev xvfb xauth
  # the engine monitor: Dear ImGui and its OpenGL3 renderer; Mesa (llvmpipe) draws it on Xvfb
  libimgui-dev libgl1-mesa-dri libqt6opengl6-dev
  # the studio end-to-end test: keystrokes and screen captures on Xvfb
  xdotool imagemagick
  # hardening: libFuzzer targets (clang 14 and its fuzzer runtime); the full-disk test's private tmpfs (unshare)
  clang-14 libclang-rt-14-dev util-linux
  # packages (packaging/): the icon's PNG sizes, the man pages; the package test's checks
  librsvg2-bin help2man lintian desktop-file-utils appstream man-db
  # the cluster tests: a one-node Slurm (tests/slurm), the Kubernetes manifests' check (tests/deploy)
  slurmctld slurmd slurm-client munge python3-yaml
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node (the openai SDK test client of tests/server): Debian's when none is installed.
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs npm); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The test clients' npm packages, exactly as tests/server/package-lock.json
# pins them; nothing is fetched when that lock was already installed (offline runs).
server_tests="$(cd "$(dirname "$0")/../tests/server" && pwd)"
if ! cmp -s "$server_tests/package-lock.json" "$server_tests/node_modules/.installed-lock.json"; then
  echo "setup: npm ci in tests/server"
  (cd "$server_tests" && npm ci --no-audit --no-fund --loglevel=error &&
   cp package-lock.json node_modules/.installed-lock.json)
fi
