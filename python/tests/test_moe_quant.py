"""moe_ffn on quantised experts through torch: MoeExperts(weights="int8" / "int4"), SparseMoeBlock and
ExpertParallel quantising at (re)pack, HF Qwen3-MoE / Mixtral state_dicts loaded as they are; each
against the float64 HF reference on the dequantised weights (quantize_weights + dequantize_weights)."""
import pytest
import torch

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
