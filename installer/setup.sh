#!/usr/bin/env bash
# Installs every Debian 12 package that Atelier's build, tests and app need.
# Idempotent: a no-op (no apt-get call at all) when everything is present.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build ccache pkg-config
  # engine
  libsqlite3-dev libssl-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libicu-dev
  libcurl4-openssl-dev libpng-dev libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # ui
  qt6-base-dev libgl-dev xvfb xauth
  # the studio end-to-end test: keystrokes and screen captures on Xvfb
  xdotool imagemagick
  # hardening: libFuzzer targets (clang 14 and its fuzzer runtime); the full-disk test's private tmpfs (unshare)
  clang-14 libclang-rt-14-dev util-linux
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
