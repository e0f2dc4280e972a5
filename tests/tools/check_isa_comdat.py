#!/usr/bin/env python3
"""Portable code never runs a copy built for a wider ISA: usage: check_isa_comdat.py BINARY OBJDIR [BINARY OBJDIR ...].

An inline function or template instantiated both in a portable object and in a per-ISA object
(`name__avx512.cpp` etc.) is one weak (COMDAT) symbol; the linker keeps one copy. If it keeps the
per-ISA one, portable code calls AVX-512 instructions and dies with SIGILL on a CPU without them
(seen: std::vector<char>::_M_fill_assign from src/gdn/chunk_fused__avx512bf16.cpp reached from
src/gemm/backward_forms.cpp on an AVX2-only CPU). The build puts per-ISA objects last
(ot_isa_sources in CMakeLists.txt); this check disassembles every weak symbol the two kinds of
object share and fails if the linked copy uses ymm/zmm/mask/tile registers, which code compiled for
baseline x86-64 never does.
"""
import pathlib
import re
import subprocess
import sys

from checks import check, finish

ISA_OBJ = re.compile(r"__(avx2|avx512|avx512bf16|amx)\.cpp\.o$")
WIDE = re.compile(r"%(ymm|zmm|k[1-7]|tmm)\d*\b")


def weak_symbols(objs):
    """The weak symbols the objects define (one nm run for all of them)."""
    out = subprocess.run(["nm", "--defined-only", *map(str, objs)], capture_output=True, text=True, check=True).stdout
    return {parts[2] for parts in (l.split() for l in out.splitlines()) if len(parts) == 3 and parts[1] in "WV"}


def bodies(binary, names):
    """The disassembly of each named function in the linked binary: only its bytes (nm -S gives
    where they are), not the whole binary (a 10 s objdump of libot.so for a handful of symbols)."""
    out = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[3] not in names or parts[3] in found:
            continue
        start, size = int(parts[0], 16), int(parts[1], 16)
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start:#x}",
                              f"--stop-address={start + size:#x}", str(binary)],
                             capture_output=True, text=True, check=True).stdout
        found[parts[3]] = [l for l in dis.splitlines() if re.match(r"^ +[0-9a-f]+:", l)]
    return found


args = sys.argv[1:]
check(len(args) >= 2 and len(args) % 2 == 0, "usage: check_isa_comdat.py BINARY OBJDIR [BINARY OBJDIR ...]")
for binary, objdir in zip(args[0::2], args[1::2]):
    objs = sorted(pathlib.Path(objdir).rglob("*.o"))
    isa = [o for o in objs if ISA_OBJ.search(o.name)]
    portable = [o for o in objs if not ISA_OBJ.search(o.name)]
    check(portable, f"{objdir}: no portable objects found")
    shared = set()
    if isa:
        shared = weak_symbols(portable) & weak_symbols(isa)
    found = bodies(binary, shared) if shared else {}
    bad = sorted(name for name, body in found.items() if any(WIDE.search(l) for l in body))
    check(not bad, f"{binary}: portable code links a per-ISA copy of {len(bad)} shared symbol(s): " + ", ".join(bad[:10]))
    print(f"{pathlib.Path(binary).name}: {len(isa)} per-ISA objects, {len(shared)} weak symbols shared with portable code, "
          f"{len(found)} present in the binary, {len(bad)} with wide registers")
finish("isa comdat: ok")
