#!/usr/bin/env python3
"""The references stand beside the fast path, not inside it: no file of src/ref/ may include,
directly or through the headers it includes, anything from src/moe, src/gdn, src/gemm or src/ep
(a bug in a shared planner or epilogue would otherwise pass both sides of every test).

Usage: check_ref_boundary.py SRC_REF_DIR   (the repository root is two levels up from it)
Prints each offending include with the chain that reaches it; exit status 1 when there is any.
"""
import os
import re
import sys

FORBIDDEN = ("src/moe/", "src/gdn/", "src/gemm/", "src/ep/")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def resolve(root, including_file, name):
    """The repository-relative path of a quoted include, or None (a system or generated header)."""
    for base in (os.path.dirname(including_file), root, os.path.join(root, "include")):
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(path):
            return os.path.relpath(path, root)
    return None


def offences(root, start):
    """(chain, include) for every forbidden include reachable from the file `start`."""
    found, seen, stack = [], {start}, [(start, [start])]
    while stack:
        rel, chain = stack.pop()
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            target = resolve(root, os.path.join(root, rel), name) or name
            if target.startswith(FORBIDDEN):
                found.append((chain, name))
            elif target not in seen and os.path.isfile(os.path.join(root, target)):
                seen.add(target)
                stack.append((target, chain + [target]))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ref_dir = os.path.abspath(sys.argv[1])
    root = os.path.dirname(os.path.dirname(ref_dir))
    files = sorted(f for f in os.listdir(ref_dir) if f.endswith((".h", ".cpp", ".inc")))
    bad = 0
    for f in files:
        rel = os.path.relpath(os.path.join(ref_dir, f), root)
        for chain, name in offences(root, rel):
            print(f'{" -> ".join(chain)}: #include "{name}"')
            bad += 1
    if bad:
        print(f"{bad} include(s) of src/ref reach the fast path (src/moe, src/gdn, src/gemm, src/ep)")
        return 1
    print(f"{len(files)} files of src/ref include only include/ot, src/core and src/ref")
    return 0


if __name__ == "__main__":
    sys.exit(main())
