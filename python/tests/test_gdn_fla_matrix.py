"""An fla-style test matrix for chunk_gated_delta_rule: the shapes, dtypes and options of
flash-linear-attention's own GDN tests (test_chunk / test_chunk_varlen), checked with fla's metric
against our float64 token recurrence and its autograd gradients.

Metric (fla's assert_close): pass if max|ref - ours| <= 1e-6, else
ratio = rms(ref - ours) / rms(ref) must be below the tolerance: o, ht 5e-3; dq, dk, dv, dh0 8e-3;
dbeta, dg 2e-2. The float64 reference reads the same (rounded) leaf tensors as the op, so the
comparison measures the op's arithmetic, not the input rounding.

The grid: every row below runs for fp32, bf16 and fp16 inputs (the full product of fla's axes would
be thousands of cases; the rows cover each axis value at least once: T up to 1024 with odd
lengths, HV = H, 2H and 4H, D 60/64/100/128, scale 0.1 and 1, gate normalisers 0.01 (saturated
gates, g ~ -70) to 10, masked gates, h0 on/off, l2norm in the kernel on/off, varlen with 1-token
sequences and h0 in the input dtype)."""
import pytest
import torch
import torch.nn.functional as F

from conftest import need
from gdn_reference import recurrence_seq

pytestmark = need("chunk_gated_delta_rule", "chunk_gated_delta_rule_bwd")
from ops_transformer import gdn

TOL = {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dh0": 8e-3, "dbeta": 2e-2, "dg": 2e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_close(name, ref, got):
    """fla's assert_close: max abs error <= 1e-6, or rms ratio below the tolerance."""
    ref, got = ref.double(), got.double()
    diff = (ref - got).abs().max().item()
    ratio = ((ref - got).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)).item()
    assert diff <= 1e-6 or ratio < TOL[name], f"{name}: max abs {diff:.3g}, ratio {ratio:.3g} (tol {TOL[name]})"


def make_inputs(B, T, H, HV, D, dtype, normalizer, mask_p, l2_in_kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(B, T, H, D, generator=gen)
    k = torch.rand(B, T, H, D, generator=gen)
    if not l2_in_kernel:  # fla normalises q, k before the call unless the kernel does
        q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    v = torch.rand(B, T, HV, D, generator=gen)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen)) / normalizer
    g = g * (torch.rand(B, T, HV, generator=gen) > mask_p)
    beta = torch.rand(B, T, HV, generator=gen).sigmoid()
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta


def reference(q, k, v, g, beta, scale, h0, l2, cu, dO, dht):
    """float64 recurrence per sequence; o, ht and the gradients of sum(o dO) + sum(ht dht)."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, g, beta)]
    h0d = None if h0 is None else h0.detach().double().requires_grad_()
    qd, kd, vd, gd, bd = leaves
    if l2:
        qn = qd / torch.sqrt((qd * qd).sum(-1, keepdim=True) + 1e-6)
        kn = kd / torch.sqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
    else:
        qn, kn = qd, kd
    B, T, _, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    o_rows, finals = [[] for _ in range(B)], []
    for n, (b, s, e) in enumerate(seqs):
        S = torch.zeros(HV, DK, DV, dtype=torch.float64) if h0d is None else h0d[n]
        o, S = recurrence_seq(qn[b, s:e], kn[b, s:e], vd[b, s:e], gd[b, s:e], bd[b, s:e], scale, S)
        o_rows[b].append(o)
        finals.append(S)
    o = torch.stack([torch.cat(r) for r in o_rows])
    ht = torch.stack(finals)
    ((o * dO.double()).sum() + (ht * dht.double()).sum()).backward()
    grads = {"dq": qd.grad, "dk": kd.grad, "dv": vd.grad, "dg": gd.grad, "dbeta": bd.grad}
    if h0d is not None:
        grads["dh0"] = h0d.grad
    return o.detach(), ht.detach(), grads


def run_case(B, T, H, HV, D, scale, normalizer, mask_p, use_h0, l2, dtype, cu=None, h0_dtype=torch.float32, seed=0):
    q, k, v, g, beta = make_inputs(B, T, H, HV, D, dtype, normalizer, mask_p, l2, seed)
    N = B if cu is None else len(cu) - 1
    gen = torch.Generator().manual_seed(seed + 1)
    h0 = torch.randn(N, HV, D, D, generator=gen).to(h0_dtype) if use_h0 else None
    dO = torch.randn(B, T, HV, D, generator=gen).to(dtype)
    dht = torch.randn(N, HV, D, D, generator=gen)
    ro, rht, rg = reference(q, k, v, g, beta, scale, h0, l2, cu, dO, dht)

    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    h0l = None if h0 is None else h0.clone().requires_grad_()
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    o, ht = gdn.chunk_gated_delta_rule(*leaves, scale=scale, initial_state=h0l, output_final_state=True,
                                       cu_seqlens=cu_t, use_qk_l2norm_in_kernel=l2)
    assert o.dtype == dtype and ht.dtype == torch.float32
    ((o.float() * dO.float()).sum() + (ht * dht).sum()).backward()
    assert_close("o", ro, o)
    assert_close("ht", rht, ht)
    for name, x in zip(("dq", "dk", "dv", "dg", "dbeta"), leaves):
        assert x.grad.dtype == x.dtype
        assert_close(name, rg[name], x.grad)
    if h0l is not None:
        assert h0l.grad.dtype == h0_dtype
        assert_close("dh0", rg["dh0"], h0l.grad)


# (B, T, H, HV, D, scale, gate normaliser, mask_p, h0, l2norm in kernel); fla's test_chunk rows,
# with its (B, T) kept where the float64 reference stays cheap and HV = 2H / 4H added.
FIXED = [
    (1, 1024, 1, 2, 128, 0.1, 1.0, 0.0, True, False),
    (2, 75, 2, 2, 64, 1.0, 0.1, 0.5, False, True),
    (1, 500, 1, 4, 60, 0.1, 1.0, 0.0, True, True),
    (1, 1000, 1, 1, 64, 0.1, 10.0, 0.5, True, False),
    (1, 333, 1, 2, 100, 0.1, 0.01, 0.0, True, False),   # g ~ -70: saturated gates
    (1, 257, 2, 8, 64, 1.0, 1.0, 0.5, False, True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("B,T,H,HV,D,scale,normalizer,mask_p,h0,l2", FIXED)
def test_chunk(B, T, H, HV, D, scale, normalizer, mask_p, h0, l2, dtype):
    run_case(B, T, H, HV, D, scale, normalizer, mask_p, h0, l2, dtype)


# fla's test_chunk_varlen: h0 per sequence in the input dtype, 1-token sequences, partial chunks.
VARLEN = [
    ([0, 15], 2, 4, 60, 0.0),
    ([0, 1, 2, 67, 200, 201, 456], 1, 2, 64, 0.5),
    ([0, 256, 500, 1000], 1, 4, 100, 0.0),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("cu,H,HV,D,mask_p", VARLEN)
def test_chunk_varlen(cu, H, HV, D, mask_p, dtype):
    run_case(1, cu[-1], H, HV, D, D ** -0.5, 1.0, mask_p, True, False, dtype, cu=cu, h0_dtype=dtype, seed=len(cu))
