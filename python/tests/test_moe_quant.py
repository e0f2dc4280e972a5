"""moe_ffn on quantised experts through torch: MoeExperts(weights="int8" / "int4"), SparseMoeBlock and
ExpertParallel quantising at (re)pack, HF Qwen3-MoE / Mixtral state_dicts loaded as they are; each
against the float64 HF reference on the dequantised weights (quantize_weights + dequantize_weights)."""
import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import need, rel_err
from moe_reference import hf_moe

moe = ot.moe


def dequantised(w, fmt, gs, sym):
    """Stacked nn.Linear weights [E, out, in] through quantize_weights / dequantize_weights (the
    quantised dimension K is `in`), back in the [E, out, in] layout."""
    q, s, o = moe.quantize_weights(w.transpose(1, 2).contiguous(), fmt, gs, sym)
    return moe.dequantize_weights(q, s, o, gs).transpose(1, 2)


def stacked(blk, name):
    return torch.stack([getattr(e, name).weight.detach() for e in blk.experts])


@need("moe_ffn", "quantize_weights")
@pytest.mark.parametrize("fmt,gs,sym", [("int8", 0, True), ("int8", 0, False), ("int4", 32, True), ("int4", 64, False),
                                        ("int4", 128, True)])
def test_sparse_moe_block_quantised_matches_dequantised_reference(fmt, gs, sym):
    H, E, I, K = 128, 8, 128, 2
    src = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True)  # an HF-keyed fp32 state_dict
    blk = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True, weights=fmt, group_size=gs, symmetric=sym)
    blk.load_state_dict(src.state_dict())
    for T in (0, 1, 7):
        x = torch.randn(T, H)
        with torch.no_grad():
            y, logits = blk(x)
        assert y.shape == (T, H)
        if T == 0:
            continue
        dq = [dequantised(stacked(src, n), fmt, gs, sym) for n in ("gate_proj", "up_proj", "down_proj")]
        ry, *_ = hf_moe(x, src.gate.weight.detach(), *dq, K, True)
        assert rel_err(y, ry) < 1e-4, (fmt, gs, sym, T)
        # and the quantisation error itself is that of the format, not a wrong layout
        fy, *_ = hf_moe(x, src.gate.weight.detach(), stacked(src, "gate_proj"), stacked(src, "up_proj"),
                        stacked(src, "down_proj"), K, True)
        assert rel_err(y, fy) < (0.02 if fmt == "int8" else 0.2)


@need("moe_ffn", "quantize_weights")
def test_mixtral_state_dict_int4_bf16():
    H, E, I, K = 64, 4, 64, 2
    src = moe.SparseMoeBlock(H, E, I, K, dtype=torch.bfloat16)
    mix = {"gate.weight": src.gate.weight.detach()}
    for i, e in enumerate(src.experts):
        mix[f"experts.{i}.w1.weight"] = e.gate_proj.weight.detach()
        mix[f"experts.{i}.w3.weight"] = e.up_proj.weight.detach()
        mix[f"experts.{i}.w2.weight"] = e.down_proj.weight.detach()
    blk = moe.SparseMoeBlock.from_mixtral_state_dict(mix, top_k=K, weights="int4", group_size=32, symmetric=False)
    x = torch.randn(5, H).bfloat16()
    with torch.no_grad():
        y, _ = blk(x)
    assert y.dtype == torch.bfloat16
    dq = [dequantised(stacked(src, n), "int4", 32, False) for n in ("gate_proj", "up_proj", "down_proj")]
    ry, *_ = hf_moe(x, src.gate.weight.detach(), *dq, K, True)
    assert rel_err(y, ry) < 1e-2  # bf16 activations and output


@need("moe_ffn", "quantize_weights")
def test_moe_experts_store_and_errors():
    E, H, I = 4, 64, 64
    g, u, d = torch.randn(E, I, H), torch.randn(E, I, H), torch.randn(E, H, I)
    f = moe.MoeExperts(g, u, d)
    q8 = moe.MoeExperts(g, u, d, weights="int8")
    q4 = moe.MoeExperts(g, u, d, weights="int4")  # group 64 by default
    assert (f.weights(), q8.weights(), q4.weights(), q8.group_size(), q4.group_size()) == ("float", "int8", "int4", 0, 64)
    assert q4.num_experts() == E and q4.hidden() == H and q4.intermediate() == I
    assert q4.packed_bytes() < q8.packed_bytes() < f.packed_bytes()
    with pytest.raises(RuntimeError, match="rebuilt whole"):
        q8.set_expert(0, g[0], u[0], d[0], "torch")
    with pytest.raises(ValueError, match="weights"):
        moe.MoeExperts(g, u, d, weights="int3")
    with pytest.raises(RuntimeError, match="group_size"):
        moe.MoeExperts(g, u, d, weights="int4", group_size=48)
    with pytest.raises(RuntimeError, match="group_size"):
        moe.MoeExperts(g[:, :32], u[:, :32], d[:, :, :32], weights="int4", group_size=64)  # I = 32: no multiple of 64
    # fused gate_up (up=None) quantises to the same store
    router = moe.PackedWeight(torch.randn(E, H))
    x = torch.randn(6, H)
    a = moe.moe_ffn(x, router, moe.MoeExperts(g, u, d, weights="int4", group_size=32), k=2)[0]
    b = moe.moe_ffn(x, router, moe.MoeExperts(torch.cat([g, u], 1), None, d, weights="int4", group_size=32), k=2)[0]
    assert torch.equal(a, b)


@need("moe_ffn", "quantize_weights")
def test_expert_parallel_int8():
    from moe_reference import QwenExpert
    H, I, E, K = 64, 64, 4, 2
    experts = [QwenExpert(H, I) for _ in range(E)]
    mb = moe.ExpertParallel(experts, top_k=K, capacity_factor=None)
    mq = moe.ExpertParallel(experts, top_k=K, capacity_factor=None, precision="int8", gate=mb.gate)
    x = torch.randn(9, H)
    with torch.no_grad():
        yb, yq = mb(x), mq(x)
    assert yq.dtype == x.dtype and rel_err(yq, yb) < 0.03
    mq.set_expert(1, QwenExpert(H, I))  # a quantised store is repacked whole
    with torch.no_grad():
        assert mq(x).shape == x.shape


def int8_rows(x):
    """Per-token int8 quantise-dequantise (the W8A8 activations): d = max|row| / 127 in fp32, codes
    rounded half to even (torch.round) and clamped."""
    xf = x.float()
    d = xf.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(xf / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(xf))
    return q.clamp(-128, 127) * d


@need("quantize_weights", "grouped_matmul")
@pytest.mark.parametrize("sym,gs", [(True, 0), (False, 64)])
def test_grouped_matmul_w8a8(sym, gs):
    sizes, K, N = [3, 0, 1, 9, 20], 128, 70
    G, M = len(sizes), sum(sizes)
    q, s, o = moe.quantize_weights(torch.randn(G, K, N) * 0.05, "int8", gs, sym)
    wd = moe.dequantize_weights(q, s, o, gs)
    x = torch.randn(M, K).bfloat16()
    kw = dict(group_list=torch.tensor(sizes), group_list_type=1, split_item=2, act_type=6, antiquant_scale=[s],
              antiquant_offset=None if o is None else [o], antiquant_group_size=gs)
    (y,) = moe.grouped_matmul([x], [q], activation_quant="int8_per_token", **kw)
    (y16,) = moe.grouped_matmul([x], [q], **kw)
    want, off, xq = [], 0, int8_rows(x).double()
    for g, n in enumerate(sizes):
        z = xq[off:off + n] @ wd[g].double()
        want.append(F.silu(z[:, :N // 2]) * z[:, N // 2:])
        off += n
    want = torch.cat(want)
    assert y.dtype == torch.bfloat16 and rel_err(y, want) < 4e-3
    assert 1e-3 < rel_err(y, y16) < 0.03  # lossy against weight-only, by the int8 rounding of x
    with pytest.raises(RuntimeError, match="activation_quant"):
        moe.grouped_matmul([x], [q], activation_quant="int4", **kw)


@need("moe_ffn", "quantize_weights")
def test_sparse_moe_block_w8a8():
    H, E, I, K = 128, 8, 128, 2
    src = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True)
    a8 = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True, weights="w8a8")
    w8 = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True, weights="int8")
    a8.load_state_dict(src.state_dict())
    w8.load_state_dict(src.state_dict())
    x = torch.randn(17, H)
    with torch.no_grad():
        y, _ = a8(x)
        y8, _ = w8(x)
    dq = [dequantised(stacked(src, n), "int8", 0, True) for n in ("gate_proj", "up_proj", "down_proj")]
    ry, *_ = hf_moe(x, src.gate.weight.detach(), *dq, K, True)
    assert 1e-3 < rel_err(y, ry) < 0.03 and rel_err(y8, ry) < 1e-4
    assert moe.MoeExperts(*(stacked(src, n) for n in ("gate_proj", "up_proj", "down_proj")), weights="w8a8").weights() == "w8a8"


@need("moe_ffn", "quantize_weights")
@pytest.mark.parametrize("fmt", ["int8", "int4", "w8a8"])
def test_moe_ffn_quantised_shared_expert(fmt):
    """shared=MoeExperts(..., weights=fmt) beside quantised routed experts: the shared expert's
    dequantised FFN is added to every token; a quantised shared expert with float routed experts
    is refused by name."""
    from moe_reference import expert_ffn
    T, H, I, E, K = 9, 64, 64, 4, 2
    x, gate = torch.randn(T, H), torch.randn(E, H) / 8
    g, u, d = torch.randn(E, I, H) / 8, torch.randn(E, I, H) / 8, torch.randn(E, H, I) / 8
    sg, su, sd = torch.randn(1, I, H) / 8, torch.randn(1, I, H) / 8, torch.randn(1, H, I) / 8
    router = moe.PackedWeight(gate)
    routed = moe.MoeExperts(g, u, d, weights=fmt)
    y_shared, *_ = moe.moe_ffn(x, router, routed, k=K, shared=moe.MoeExperts(sg, su, sd, weights=fmt))
    y_routed, *_ = moe.moe_ffn(x, router, routed, k=K)
    gs = 64 if fmt == "int4" else 0
    wfmt = "int4" if fmt == "int4" else "int8"
    dsg, dsu, dsd = (dequantised(w, wfmt, gs, True) for w in (sg, su, sd))
    xs = x
    if fmt == "w8a8":  # the shared expert's input rows are quantised per token as the routed ones
        s = x.abs().amax(1, keepdim=True).clamp_min(1e-30) / 127
        xs = torch.round(x / s).clamp(-127, 127) * s
    want = expert_ffn(xs.double(), dsg[0].double(), dsu[0].double(), dsd[0].double())
    got = (y_shared - y_routed).double()
    tol = 2e-2 if fmt == "w8a8" else 1e-4  # W8A8: the SwiGLU row is quantised too
    assert rel_err(got, want) < tol, fmt
    # the shared expert was really added, and quantised (not the float weights)
    assert rel_err(got, expert_ffn(x.double(), sg[0].double(), su[0].double(), sd[0].double())) > 1e-4
    with pytest.raises(RuntimeError, match="shared"):
        moe.moe_ffn(x, router, moe.MoeExperts(g, u, d), k=K, shared=moe.MoeExperts(sg, su, sd, weights=fmt))
