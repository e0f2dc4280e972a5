#!/usr/bin/env bash
# The library as its users install it, checked from outside the source tree (./test.sh runs this
# after the release build). Usage: scripts/check_install.sh [build folder, default build/release]
#  1. cmake --install into a scratch prefix; an external CMake project finds it with
#     find_package(ops_transformer CONFIG), calls a MoE and a GDN operator and checks them; the same
#     program built with pkg-config's flags; `ot --version` from the prefix.
#  2. pip install of python/ into a fresh venv (Debian's torch through --system-site-packages),
#     then import + one op from a folder outside the repository.
#  3. cpack -G DEB; the .deb unpacked into a scratch root runs `ot --version` and has its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(realpath "${1:-build/release}")
scratch=$(mktemp -d /tmp/ot-install-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
version=$(sed -n 's/^project(ops_transformer VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)

echo "== install: cmake --install into a scratch prefix"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
"$scratch/prefix/bin/ot" --version | grep -qx "ot (ops-transformer) $version"
cmake -S tests/install/consumer -B "$scratch/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/consumer/consumer"
pcdir=$(dirname "$(find "$scratch/prefix" -name ops_transformer.pc)")
# shellcheck disable=SC2046
g++ -std=c++20 tests/install/consumer/main.cpp -o "$scratch/consumer_pc" \
  $(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs ops_transformer) -Wl,-rpath,"$scratch/prefix/lib"
"$scratch/consumer_pc" | grep -q "consumer: ok"
echo "install: find_package and pkg-config consumers ok ($version)"

echo "== install: pip install python/ into a fresh venv"
/usr/bin/python3 -m venv --system-site-packages "$scratch/venv"
OT_BUILD_DIR="$build" "$scratch/venv/bin/pip" install -q --no-build-isolation --no-deps --no-index "$root/python"
(cd "$scratch" && "$scratch/venv/bin/python" - "$version" <<'PY'
import sys, torch, ops_transformer as ot
assert ot.__version__ == sys.argv[1], (ot.__version__, sys.argv[1])
assert ot.library_path.startswith(sys.prefix), ot.library_path   # the installed copy, not the build tree
y, idx, _ = torch.ops.ops_transformer.moe_gating_top_k_softmax(torch.tensor([[1.0, 0.0, 3.0, -1.0]]), None, 2)
assert idx.tolist() == [[2, 0]], idx
print("install: venv package", ot.__version__, "at", ot.library_path)
PY
)

echo "== install: cpack -G DEB, unpacked into a scratch root"
(cd "$build" && cpack -G DEB -B "$scratch/deb" >/dev/null)
deb=$(ls "$scratch"/deb/*.deb)
dpkg-deb -f "$deb" Package Version Depends
dpkg -x "$deb" "$scratch/debroot"
"$scratch/debroot/usr/bin/ot" --version | grep -qx "ot (ops-transformer) $version"
test -f "$scratch/debroot/usr/lib/cmake/ops_transformer/ops_transformerConfig.cmake" \
  -o -f "$(ls -d "$scratch"/debroot/usr/lib/*/cmake/ops_transformer 2>/dev/null | head -1)/ops_transformerConfig.cmake"
echo "install: $(basename "$deb") runs ot --version from its own tree"
