#!/usr/bin/python3
"""Baseline for `ot bench gdn_chunk_bwd`: the chunked gated delta rule (spec section 4) written in
plain PyTorch (fp32, chunk 64, in-kernel l2norm, grouped value heads by repeat_interleave, the
triangular inverse by solve_triangular), forward and forward+backward through autograd with
loss = sum(o * dO) + sum(S_T * dht). Same Qwen3.5 shapes and case names as the C++ benchmark.

With --ot PATH the script also runs `PATH bench gdn_chunk_bwd --json --no-ref` on the same cases
and prints the speed-up of our fwd+bwd over this baseline (target >= 10x). The first line says
which BLAS torch's fp32 matmuls run on (libblas.so.3 as loaded: Debian's reference BLAS unless
LD_LIBRARY_PATH gives OpenBLAS; docs/hybrid.md, "BLAS").

    /usr/bin/python3 bench/gdn_torch_baseline.py --ot build/dev/ot [--case B1-T1024] [--threads 2]
"""
import argparse
import json
import subprocess
import time

import torch

HK, HV, DK, DV, BT = 16, 32, 128, 128, 64
CASES = {
    "qwen35-B1-T1024": (1, 1024, None),
    "qwen35-B1-T4096": (1, 4096, None),
    "qwen35-B4-T1024": (4, 1024, None),
    "qwen35-varlen": (1, 4096, [0, 1000, 1037, 1038, 3086, 3586, 4096]),  # lengths 1000, 37, 1, 2048, 500, 510
}


def chunk_gdn(q, k, v, g, beta, h0, scale):
    """One sequence batch. q, k [B,T,HK,K]; v [B,T,HV,V]; g, beta [B,T,HV]; h0 [B,HV,K,V]."""
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    grp = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(grp, dim=2), k.repeat_interleave(grp, dim=2)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B,H,T,D]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B,H,T]
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (BT - T % BT) % BT
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // BT
    q = (q * scale).reshape(B, H, N, BT, K)
    k = k.reshape(B, H, N, BT, K)
    v = v.reshape(B, H, N, BT, V)
    beta = beta.reshape(B, H, N, BT)
    G = g.reshape(B, H, N, BT).cumsum(-1)
    E = (G[..., :, None] - G[..., None, :]).tril().exp().tril()  # exp(G_i - G_j), j <= i
    eye = torch.eye(BT)
    strict = torch.ones(BT, BT).tril(-1)
    M = beta[..., None] * (k @ k.transpose(-1, -2)) * E * strict
    # W = (I+M)^-1 diag(beta e^G) K, U = (I+M)^-1 diag(beta) V
    W = torch.linalg.solve_triangular(eye + M, k * (beta * G.exp())[..., None], upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(eye + M, v * beta[..., None], upper=False, unitriangular=True)
    causal = torch.ones(BT, BT).tril()
    S = h0
    outs = []
    for c in range(N):
        qc, kc, Gc = q[:, :, c], k[:, :, c], G[:, :, c]
        Dn = U[:, :, c] - W[:, :, c] @ S
        P = (qc @ kc.transpose(-1, -2)) * E[:, :, c] * causal
        outs.append((qc * Gc.exp()[..., None]) @ S + P @ Dn)
        gl = Gc[..., -1]
        S = S * gl.exp()[..., None, None] + (kc * (gl[..., None] - Gc).exp()[..., None]).transpose(-1, -2) @ Dn
    o = torch.stack(outs, 2).reshape(B, H, N * BT, V)[:, :, :T]
    return o.transpose(1, 2), S


def run_case(name, reps):
    B, T, cu = CASES[name]
    torch.manual_seed(0)
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    nseq = len(seqs)
    q = torch.randn(B, T, HK, DK)
    k = torch.randn(B, T, HK, DK)
    v = torch.randn(B, T, HV, DV)
    g = torch.log(torch.rand(B, T, HV) * 0.5 + 0.5) * 0.2
    beta = torch.rand(B, T, HV)
    h0 = 0.1 * torch.randn(nseq, HV, DK, DV)
    dO = torch.randn(B, T, HV, DV)
    dht = 0.1 * torch.randn(nseq, HV, DK, DV)
    scale = DK ** -0.5

    def forward(params):
        q, k, v, g, beta, h0 = params
        loss = 0
        for n, (b, s, e) in enumerate(seqs):
            sl = slice(s, e)
            o, ST = chunk_gdn(q[b:b + 1, sl], k[b:b + 1, sl], v[b:b + 1, sl], g[b:b + 1, sl], beta[b:b + 1, sl], h0[n:n + 1], scale)
            loss = loss + (o * dO[b:b + 1, sl]).sum() + (ST * dht[n:n + 1]).sum()
        return loss

    def fwd():
        with torch.no_grad():
            forward((q, k, v, g, beta, h0))

    def fwd_bwd():
        params = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
        forward(params).backward()

    def median_ms(fn):
        """Median wall and process-CPU milliseconds."""
        fn()
        ts, cs = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
            cs.append((time.process_time() - c0) * 1e3)
        return sorted(ts)[len(ts) // 2], sorted(cs)[len(cs) // 2]

    return median_ms(fwd), median_ms(fwd_bwd)


def blas_line():
    """torch's build setting and the BLAS library this process actually loaded."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    info = next((p.strip().rsplit(" ", 1)[-1] for p in torch.__config__.show().split(",") if "BLAS_INFO" in p), "BLAS_INFO=?")
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "blas" in line.split()[-1].rsplit("/", 1)[-1]})
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads, {info}; loaded: {', '.join(libs) or 'none'}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ot", default="", help="path of the ot binary to compare against")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ours = {}
    if args.ot:
        out = subprocess.run([args.ot, "bench", "gdn_chunk_bwd", "--json", "--no-ref", "--dtype", "fp32", "--threads", str(args.threads),
                              "--case", args.case], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                ours[j["name"]] = (j["fwd_plus_bwd_ms"], j["fwd_cpu_ms"] + j["bwd_cpu_ms"])
    print(blas_line())
    # Wall times, and process CPU times (the contention-free figure on a shared machine at 1 thread).
    print(f"{'case':<18} {'torch fwd':>10} {'torch f+b':>10} {'ot f+b':>8} {'speed-up':>9} | {'cpu: torch f+b':>14} {'ot f+b':>8} {'speed-up':>9}")
    for name in CASES:
        if args.case and args.case not in name:
            continue
        (f, fc), (fb, fbc) = run_case(name, args.repeats)
        o, oc = ours.get(name, (0, 0))
        print(f"{name:<18} {f:10.1f} {fb:10.1f} {o:8.1f} {fb / o if o else 0:8.1f}x | {fbc:14.1f} {oc:8.1f} {fbc / oc if oc else 0:8.1f}x (torch fwd cpu {fc:.1f})",
              flush=True)


if __name__ == "__main__":
    main()
