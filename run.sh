#!/usr/bin/env bash
# The main job: installs packages, builds, and runs the library's headline run on its built-in
# default configuration.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
scripts/build.sh release
if ./build/release/ot demo --help >/dev/null 2>&1; then
  exec ./build/release/ot demo "$@"
fi
./build/release/ot peak
exec ./build/release/ot bench gemm "$@"
