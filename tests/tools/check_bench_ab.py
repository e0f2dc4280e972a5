#!/usr/bin/env python3
"""In-process A/B: usage: check_bench_ab.py OT_BINARY.

`ot bench <op> --ab <knob>=<a>,<b>` times every repetition once with the internal knob at a and once
at b, in ABBA order, and reports both medians and the paired ratios b/a (JSON ab_* fields, side b's
GB/s for a GB/s row, a line under the text row). With OT_LOG=1 each gemm call logs its kernel, so the knob gemm.decode_rows at
0 (the 8x48 kernel) and 3 (the decode kernel) on a 2-row GEMM shows the order of the sides call by
call. Bad --ab values are errors naming the knob (an unknown one lists the known knobs).
"""
import json
import os
import subprocess
import sys

from checks import check, finish

ot = sys.argv[1]
PAIRS = 6
ARGS = ["bench", "gemm", "--m", "2", "--n", "1024", "--k", "1024", "--repeats", str(PAIRS), "--no-ref"]


def run(*extra, log=False):
    env = dict(os.environ, OT_LOG="1" if log else "0")
    return subprocess.run([ot, *ARGS, *extra], capture_output=True, text=True, timeout=300, env=env)


r = run("--json", "--ab", "gemm.decode_rows=0,3", log=True)
check(r.returncode == 0, f"--ab run exited {r.returncode}: {r.stderr[-2000:]}")
rows = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
check(len(rows) == 1, f"rows: {len(rows)}")
row = rows[0] if rows else {}
for key in ("ab_knob", "ab_a", "ab_b", "ab_pairs", "ab_a_ms", "ab_b_ms", "ab_ratio_b_over_a_median", "ab_ratio_b_over_a_p25",
            "ab_ratio_b_over_a_p75"):
    check(key in row, f"no {key} in {row}")
if "ab_ratio_b_over_a_p75" in row:
    check(row["ab_knob"] == "gemm.decode_rows" and row["ab_a"] == 0 and row["ab_b"] == 3, f"spec: {row}")
    check(row["ab_pairs"] == PAIRS, f"ab_pairs {row['ab_pairs']} != {PAIRS}")
    check(row["ab_a_ms"] > 0 and row["ab_b_ms"] > 0, f"side medians: {row}")
    check(row["ms"] == row["ab_a_ms"], f"the row's ms {row['ms']} is not side a's median {row['ab_a_ms']}")
    lo, med, hi = row["ab_ratio_b_over_a_p25"], row["ab_ratio_b_over_a_median"], row["ab_ratio_b_over_a_p75"]
    check(0 < lo <= med <= hi, f"ratio quantiles not ordered: {lo} {med} {hi}")
    b_gbps = row["gbps"] * row["ab_a_ms"] / row["ab_b_ms"]
    check(abs(row.get("ab_b_gbps", 0) - b_gbps) <= 1e-9 * b_gbps, f"ab_b_gbps {row.get('ab_b_gbps')} != gbps * a_ms / b_ms = {b_gbps}")

# The sides call by call: a = gemm.decode_rows 0 (kernel avx512_bf16, avx512_bf16_widen where
# vdpbf16ps is the slower multiplier, or avx2_bf16), b = 3
# (avx512_bf16_decode / avx2_bf16_decode).
# Warm-up b then a; the window read tests (before pair 0 and pair PAIRS/2) are each followed by
# one untimed call on side a; pair i is a,b for even i and b,a for odd i. Later calls (the kernel
# name, the CPU-time estimate) run at the knob's default again (3: the decode kernel).
kernels = [l.split("kernel=")[1].split()[0] for l in r.stderr.splitlines() if l.startswith("[ot] gemm ")]
side = {"avx512_bf16": "a", "avx512_bf16_widen": "a", "avx512_bf16_decode": "b", "avx2_bf16": "a", "avx2_bf16_decode": "b"}
expect = ["b", "a"]
for i in range(PAIRS):
    if i in (0, PAIRS // 2):
        expect.append("a")
    expect += ["a", "b"] if i % 2 == 0 else ["b", "a"]
got = [side.get(k, k) for k in kernels]
if set(kernels) <= set(side):
    check(got[:len(expect)] == expect, f"sides in call order {got[:len(expect)]}, expected {expect}")
    check(len(got) > len(expect) and all(s == "b" for s in got[len(expect):]), f"calls after the timing not at the default: {got[len(expect):]}")
else:
    # Without AVX2 there is no decode kernel: both sides run the same kernel, so only the
    # number of calls (warm-ups, window follow-ups, pairs, later calls) can be checked.
    print(f"note: kernels {sorted(set(kernels))} do not tell the sides apart on this CPU; checking the call count only")
    check(len(set(kernels)) == 1, f"one kernel expected for both sides on this CPU, got {sorted(set(kernels))}")
    check(len(got) > len(expect), f"{len(got)} gemm calls logged, expected more than the {len(expect)} of warm-up and pairs")

# The text table: side a's row, then the A/B line.
r = run("--ab", "gemm.decode_rows=0,3")
check(r.returncode == 0, f"text --ab run exited {r.returncode}: {r.stderr[-2000:]}")
print(r.stdout)
ab_lines = [l for l in r.stdout.splitlines() if " ab gemm.decode_rows: a=0 " in l]
check(len(ab_lines) == 1 and "b=3" in ab_lines[0] and f"{PAIRS} pairs" in ab_lines[0] and "b/a median" in ab_lines[0],
      f"text A/B line: {ab_lines}")

# Bad --ab values: errors (exit 2) naming what is wrong.
for spec, want in (("no.such.knob=1,2", "gemm.decode_rows"), ("gemm.decode_rows=1", "<knob>=<a>,<b>"),
                   ("gemm.decode_rows=1,x", "<knob>=<a>,<b>"), ("gemm.decode_rows=0,99", "99")):
    r = run("--ab", spec)
    check(r.returncode == 2 and want in r.stderr, f"--ab {spec}: exit {r.returncode}, stderr {r.stderr[-500:]!r} (expected {want!r})")
finish("bench A/B: ok")
