#!/usr/bin/env bash
# All set-up and every test: installs packages, builds release and sanitizer (ASan+UBSan) builds,
# runs the C++ suites (CTest) on both, checks the installed forms (CMake package, pkg-config, pip,
# .deb), then the Python tests on the package pip-installed from the release build.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
scripts/build.sh release
scripts/build.sh asan
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Two test processes at a time (the long families run as shards); OpenMP threads sleep instead of
# spinning when they wait, so the two do not take each other's cores. Timed tests reserve all slots.
jobs=$(nproc)
echo "== C++ tests (release)"
OMP_WAIT_POLICY=PASSIVE ctest --test-dir build/release --output-on-failure -j "$jobs"
echo "== C++ tests (ASan + UBSan)"
OMP_WAIT_POLICY=PASSIVE ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build/asan --output-on-failure -j "$jobs"
echo "== Install checks"
scripts/check_install.sh build/release
echo "== Python tests (the package as pip installs it, into build/venv)"
[ -x build/venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build/venv
OT_BUILD_DIR="$PWD/build/release" build/venv/bin/pip install -q --no-build-isolation --no-deps --no-index ./python
build/venv/bin/python -m pytest -q python/tests
