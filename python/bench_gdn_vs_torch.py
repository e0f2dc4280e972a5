#!/usr/bin/env python3
"""Gated DeltaNet forward + backward: the library's autograd op against plain PyTorch autograd over
the chunked form written in torch (fla's naive chunk algorithm, fp32: the WY representation by
forward substitution, then the chunk-state scan), on the same inputs and gradients.

    OMP_NUM_THREADS=2 /usr/bin/python3 python/bench_gdn_vs_torch.py [--T 1024] [--repeats 3]

Prints which BLAS torch runs on (its fp32 matmuls are the twin's cost; see docs/hybrid.md for
giving it Debian's OpenBLAS), the median fwd+bwd time of each side, their ratio, and the largest
relative gradient difference between the two (a check that both compute the same thing).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import ops_transformer as ot
from ops_transformer import gdn


def torch_chunk_gdn(q, k, v, g, beta, scale, chunk=64):
    """fla's naive chunked form in plain torch, fp32, time-major [B, T, H, D] inputs with q, k
    already l2-normalised and repeated to the value heads. Returns o [B, T, H, DV]."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    q, k, v = (F.pad(x.transpose(1, 2).float(), (0, 0, 0, pad)) for x in (q, k, v))  # [B, H, T', D]
    g, beta = (F.pad(x.transpose(1, 2).float(), (0, pad)) for x in (g, beta))         # [B, H, T']
    n = q.shape[2] // chunk
    q, k, v = (x.reshape(B, H, n, chunk, -1) for x in (q * scale, k, v))
    g, beta = g.reshape(B, H, n, chunk).cumsum(-1), beta.reshape(B, H, n, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    decay = (g[..., :, None] - g[..., None, :]).tril().exp().tril()
    strict = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), 0)
    # T = (I + strict(diag(beta) K K^T o decay))^-1 by forward substitution, row by row.
    a = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(strict, 0)
    rows = [a[..., 0, :]]
    for i in range(1, chunk):
        prev = torch.stack(rows, -2)                                  # rows 0..i-1 of the result
        rows.append(a[..., i, :] + (a[..., i, :i, None] * prev[..., :i, :]).sum(-2))
    A = torch.stack(rows, -2) + torch.eye(chunk)
    w = A @ (k_beta * g.exp()[..., None])
    u = A @ v_beta
    causal = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool), 1)
    S = q.new_zeros(B, H, DK, DV)
    outs = []
    for c in range(n):
        qc, kc, gc = q[:, :, c], k[:, :, c], g[:, :, c]
        v_new = u[:, :, c] - w[:, :, c] @ S
        attn = (qc @ kc.transpose(-1, -2) * decay[:, :, c]).masked_fill(causal, 0)
        outs.append((qc * gc.exp()[..., None]) @ S + attn @ v_new)
        S = S * gc[..., -1, None, None].exp() + (kc * (gc[..., -1, None] - gc).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(outs, 2).reshape(B, H, n * chunk, DV)[:, :, :T]
    return o.transpose(1, 2)


def torch_twin(q, k, v, g, beta):
    """The whole op in torch: l2norm of q and k, key heads repeated to the value heads."""
    group = v.shape[2] // q.shape[2]
    qn, kn = (F.normalize(x.float(), dim=-1, eps=1e-6).repeat_interleave(group, dim=2) for x in (q, k))
    return torch_chunk_gdn(qn, kn, v, g, beta, q.shape[-1] ** -0.5)


def make_inputs(T, HK, HV, D, dtype, seed=0):
    torch.manual_seed(seed)
    q, k = (torch.randn(1, T, HK, D).to(dtype) for _ in range(2))
    v = torch.randn(1, T, HV, D).to(dtype)
    g = F.logsigmoid(torch.randn(1, T, HV)) * 0.5  # gates in (-inf, 0), mostly mild decay
    beta = torch.rand(1, T, HV)
    return q, k, v, g, beta


def fwd_bwd(fn, inputs, do):
    args = [x.clone().requires_grad_() for x in inputs]
    o = fn(*args)
    (o.float() * do).sum().backward()
    return [a.grad for a in args]


def ours(q, k, v, g, beta):
    return gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]


def median_s(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def max_rel_diff(a, b):
    return max(((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def blas_line():
    """torch's build setting and the BLAS library this process actually loaded (libblas.so.3 is
    whatever Debian's alternatives or LD_LIBRARY_PATH give)."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    info = next((part.strip().rsplit(" ", 1)[-1] for part in torch.__config__.show().split(",") if "BLAS_INFO" in part), "BLAS_INFO=?")
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in path.rsplit("/", 1)[-1]:
                libs.add(path)
    return f"{info}; loaded: {', '.join(sorted(libs)) or 'none'}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--heads", default="16,32", help="key heads, value heads (Qwen3.5: 16,32)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="the library side's q, k, v (the twin runs fp32)")
    a = p.parse_args()
    HK, HV = (int(x) for x in a.heads.split(","))
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    inputs = make_inputs(a.T, HK, HV, a.dim, dt)
    twin_inputs = [x.float() for x in inputs]
    torch.manual_seed(1)
    do = torch.randn(1, a.T, HV, a.dim)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {blas_line()}")
    print(f"shape B1 T{a.T} HK{HK} HV{HV} D{a.dim}, library q/k/v {a.dtype}, twin fp32, l2norm in kernel")
    ours_grads = fwd_bwd(ours, inputs, do)  # warm-up, and the gradients compared below
    twin_grads = fwd_bwd(torch_twin, twin_inputs, do)
    t_ours = median_s(lambda: fwd_bwd(ours, inputs, do), a.repeats)
    t_twin = median_s(lambda: fwd_bwd(torch_twin, twin_inputs, do), a.repeats)
    print(f"library fwd+bwd {t_ours * 1e3:9.1f} ms")
    print(f"torch   fwd+bwd {t_twin * 1e3:9.1f} ms")
    print(f"speed-up {t_twin / t_ours:.1f}x; largest relative gradient difference (q, k, v, g, beta) {max_rel_diff(ours_grads, twin_grads):.2e}")


if __name__ == "__main__":
    main()
