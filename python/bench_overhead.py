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


def py_call_us(fn, iters, clock):
    fn()
    t0 = clock()
    for _ in range(iters):
        fn()
    return (clock() - t0) / iters * 1e-3


def gdn_case(name, HK, HV, D):
    q, k = torch.randn(1, 1, HK, D).bfloat16(), torch.randn(1, 1, HK, D).bfloat16()
    v = torch.randn(1, 1, HV, D).bfloat16()
    g, beta = -torch.rand(1, 1, HV), torch.rand(1, 1, HV)
    s0 = torch.zeros(1, HV, D, D)
    f = ops.fused_recurrent_gated_delta_rule
    return (name, "fused_recurrent_gated_delta_rule", [q, k, v, g, beta, s0],
            lambda: f(q, k, v, g, beta, None, s0, True, None, True),
            lambda: ot.gdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                                                            use_qk_l2norm_in_kernel=True))


def cases():
    """(name, op for the C++ timer, its args, torch.ops call, package call); decode shapes."""
    out = []
    a, b = torch.randn(1, 256).bfloat16(), torch.randn(256, 64).bfloat16()
    c = torch.empty(1, 64, dtype=torch.bfloat16)
    out.append(("matmul-1x256x64-bf16", "matmul", [a, b, c],
                lambda: ops.matmul(a, b), lambda: ot.matmul(a, b)))
    if ot.has_op("fused_recurrent_gated_delta_rule"):  # GDN decode, 1 token: tiny (overhead-bound) and Qwen3.5
        for name, (HK, HV, D) in (("gdn-decode-tiny-h1-d16", (1, 1, 16)), ("gdn-decode-qwen35-B1", (16, 32, 128))):
            out.append(gdn_case(name, HK, HV, D))
    if ot.has_op("moe_ffn"):  # MoE layer, 1 token, k = 8 of 16 experts, H 2048, I 768, bf16
        E, H, I = 16, 2048, 768
        x = torch.randn(1, H).bfloat16()
        rw = (torch.randn(E, H) / 45).bfloat16()
        gw, uw = (torch.randn(E, I, H) / 45).bfloat16(), (torch.randn(E, I, H) / 45).bfloat16()
        dw = (torch.randn(E, H, I) / 28).bfloat16()
        router, experts = ot.moe.PackedWeight(rw), ot.moe.MoeExperts(gw, uw, dw)
        out.append(("moe-ffn-decode-T1-e16-k8-h2048-i768", "moe_ffn", [x, rw, gw, uw, dw],
                    lambda: ops.moe_ffn(x, router, experts, k=8),
                    lambda: ot.moe.moe_ffn(x, router, experts, k=8)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"threads={torch.get_num_threads()}  iters<={args.iters}  repeats={args.repeats}")
    print(f"{'case':38s} {'clock':5s} {'C++ us':>8s} {'torch.ops us':>13s} {'wrapper us':>11s} {'overhead us':>12s}"
          f" {'(wrapper)':>10s}")
    for name, op, cargs, f_ops, f_pkg in cases():
        t0 = time.perf_counter()
        f_ops()
        # Large cases: fewer calls per measurement (about 20 ms each) keep the default run short.
        iters = max(20, min(args.iters, int(0.02 / max(time.perf_counter() - t0, 1e-7))))
        for label, cpu, clock in (("wall", False, time.perf_counter_ns), ("cpu", True, time.thread_time_ns)):
            cpp, tops, pkg = [], [], []
            for _ in range(args.repeats):  # interleaved so drift hits all three alike
                cpp.append(ops._cpp_call_us(op, cargs, iters, cpu))
                tops.append(py_call_us(f_ops, iters, clock))
                pkg.append(py_call_us(f_pkg, iters, clock))
            m = [statistics.median(x) for x in (cpp, tops, pkg)]
            print(f"{name:38s} {label:5s} {m[0]:8.2f} {m[1]:13.2f} {m[2]:11.2f} {m[1] - m[0]:12.2f} {m[2] - m[0]:10.2f}")


if __name__ == "__main__":
    main()
