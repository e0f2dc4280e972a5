#!/usr/bin/env bash
# Installs every Debian package the build, tests, benchmarks and demo need. Idempotent.
# `scripts/setup.sh fuzz` adds what the clang `fuzz` preset needs (scripts/fuzz.sh calls it so).
set -euo pipefail
PKGS=(
  g++ cmake make ninja-build pkg-config          # build
  libgtest-dev                                  # C++ tests
  libcli11-dev nlohmann-json3-dev               # the ot command
  libopenmpi-dev openmpi-bin                    # expert parallelism
  libtorch-dev python3-torch python3-numpy      # PyTorch extension
  python3-pytest pybind11-dev python3-dev
  python3-setuptools python3-wheel python3-pip python3-venv   # pip install of python/
  dpkg-dev file                                 # cpack -G DEB (dpkg-shlibdeps)
  libdnnl-dev                                   # oneDNN: benchmark-only comparison
  python3-matplotlib                            # charts of `ot report`
  fortunes-min                                  # text corpus of `ot train-moe`
)
if [ "${1:-}" = fuzz ]; then
  PKGS+=(clang-14 libclang-rt-14-dev libomp-14-dev)  # fuzz preset: clang, libFuzzer + sanitizer runtimes, OpenMP
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
