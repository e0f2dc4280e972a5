#!/usr/bin/env python3
"""Per-call overhead of the PyTorch binding on 1-token decode calls.

For each case: the library call timed in C++ on views built once (ops._cpp_call_us), the same
call through torch.ops.ops_transformer.<op> from Python, and through the package's Python
wrapper. Overhead = Python time - C++ time (target <= 15 us). Medians over several repeats.

    OMP_NUM_THREADS=2 /usr/bin/python3 python/bench_overhead.py [--iters N]
"""
import argparse
import statistics
import time

import torch

import ops_transformer as ot

ops = ot.ops


def py_call_us(fn, iters):
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def cases():
    """(name, op for the C++ timer, its args, torch.ops call, package call); decode shapes."""
    out = []
    a, b = torch.randn(1, 256).bfloat16(), torch.randn(256, 64).bfloat16()
    c = torch.empty(1, 64, dtype=torch.bfloat16)
    out.append(("matmul-1x256x64-bf16", "matmul", [a, b, c],
                lambda: ops.matmul(a, b), lambda: ot.matmul(a, b)))
    for extra in getattr(ot, "_overhead_cases", lambda: [])():
        out.append(extra)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"threads={torch.get_num_threads()}  iters={args.iters}  repeats={args.repeats}")
    print(f"{'case':34s} {'C++ us':>8s} {'torch.ops us':>13s} {'wrapper us':>11s} {'overhead us':>12s}")
    for name, op, cargs, f_ops, f_pkg in cases():
        cpp, tops, pkg = [], [], []
        for _ in range(args.repeats):  # interleaved so drift hits all three alike
            cpp.append(ops._cpp_call_us(op, cargs, args.iters))
            tops.append(py_call_us(f_ops, args.iters))
            pkg.append(py_call_us(f_pkg, args.iters))
        m = [statistics.median(x) for x in (cpp, tops, pkg)]
        print(f"{name:34s} {m[0]:8.2f} {m[1]:13.2f} {m[2]:11.2f} {m[1] - m[0]:12.2f}")


if __name__ == "__main__":
    main()
