"""Gradients of the MoE ops and modules: gradcheck in float64 around the fp32 kernels (small shapes),
bf16 at realistic shapes against the float64 HF loop's autograd, and the modules' gradients (input,
router, every expert) against their plain-PyTorch twins loaded with the same weights."""
import math

import pytest
import torch

import ops_transformer as ot
from conftest import need, rel_err
from moe_reference import MixtralExpert, QwenExpert, hf_moe

moe = ot.moe
i32 = torch.int32
d64 = dict(dtype=torch.float64, requires_grad=True)


def gradcheck(f, *args, fast=False):
    """float64 gradcheck of an op computed in fp32 inside (eps and tolerances sized for fp32).
    fast: gradcheck's fast mode (random projections of the Jacobian) for many-input layers."""
    return torch.autograd.gradcheck(f, args, eps=1e-3, atol=3e-3, rtol=3e-3, fast_mode=fast)


def distinct_ids(T, E, K, gen=None):
    return torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).int()


# ---- routers, routing, finalize: float64 gradcheck ------------------------------------------------

@need("moe_gating_top_k_softmax_backward", "moe_gating_top_k_softmax_v2_backward", "moe_gating_top_k_backward")
def test_router_gradcheck():
    x = torch.randn(5, 8, **d64)
    assert gradcheck(lambda x: moe.moe_gating_top_k_softmax(x.float(), None, 3)[0].double(), x)
    assert gradcheck(lambda x: moe.moe_gating_top_k_softmax_v2(x.float(), k=3, renorm=1)[0].double(), x)
    assert gradcheck(lambda x: moe.moe_gating_top_k(x.float(), 3, norm_type=1, routed_scaling_factor=2.0)[0].double(), x)
    assert gradcheck(lambda x: moe.moe_gating_top_k(x.float(), 2, k_group=2, group_count=4, group_select_mode=1)[0].double(), x)


@need("moe_init_routing_v2_backward", "moe_init_routing_backward", "moe_token_permute_backward")
def test_routing_gradcheck():
    N, K, H, E = 6, 2, 4, 3
    ids = distinct_ids(N, E, K)
    x = torch.randn(N, H, **d64)
    # dropless with active_num cutting rows, then drop/pad with a capacity (dropped pairs get nothing)
    assert gradcheck(lambda x: moe.moe_init_routing_v2(x.float(), ids, active_num=9, expert_num=E)[0].double(), x)
    assert gradcheck(lambda x: moe.moe_init_routing_v2(x.float(), ids, expert_capacity=2, expert_num=E,
                                                       drop_pad_mode=1)[0].double(), x)
    row = torch.arange(N * K, dtype=i32).reshape(K, N).t().contiguous()
    assert gradcheck(lambda x: moe.moe_init_routing(x.float(), row, ids, 4)[0].double(), x)
    assert gradcheck(lambda x: moe.moe_token_permute(x.float(), ids, num_out_tokens=8)[0].double(), x)


@need("moe_token_unpermute_backward", "moe_finalize_routing_v2_backward")
def test_unpermute_finalize_gradcheck():
    T, K, H, E = 5, 2, 4, 4
    ids = distinct_ids(T, E, K)
    _, sidx = moe.moe_token_permute(torch.randn(T, H), ids)
    rows, probs = torch.randn(T * K, H, **d64), torch.rand(T, K, **d64)
    assert gradcheck(lambda r, p: moe.moe_token_unpermute(r.float(), sidx, p.float()).double(), rows, probs)
    erow = torch.randperm(T * K).int()
    x1, x2, bias = torch.randn(T, H, **d64), torch.randn(T, H, **d64), torch.randn(E, H, **d64)
    f = lambda r, a, b, bi, s: moe.moe_finalize_routing_v2(r.float(), erow, x1=a.float(), x2=b.float(), bias=bi.float(),
                                                           scales=s.float(), expert_idx=ids).double()
    assert gradcheck(f, rows, x1, x2, bias, probs)
    g = lambda r, s: moe.moe_finalize_routing(r.float(), None, None, None, s.float(), erow, None).double()
    assert gradcheck(g, rows, probs)


@need("moe_aux_loss_backward", "moe_z_loss_backward")
def test_loss_gradcheck():
    probs, logits = torch.rand(6, 4, **d64), torch.randn(6, 4, **d64)
    counts = torch.tensor([3, 0, 5, 4])
    assert gradcheck(lambda p: moe.moe_aux_loss(p.float(), counts, 2, 0.5).double(), probs)
    mask = torch.tensor([1, 1, 0, 1, 1, 0], dtype=torch.bool)
    assert gradcheck(lambda z: moe.moe_z_loss(z.float(), 0.1, mask).double(), logits)


# ---- the fused layer ----------------------------------------------------------------------------

def make_layer(T, H, E, I, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()
    return (r(T, H, scale=1.0), r(E, H, scale=1.0), r(E, I, H, scale=1 / math.sqrt(H)), r(E, I, H, scale=1 / math.sqrt(H)),
            r(E, H, I, scale=1 / math.sqrt(I)))


@need("moe_ffn_backward")
def test_moe_ffn_gradcheck_with_shared_residual_and_logits():
    T, H, E, I, K = 4, 6, 4, 3, 2
    x, R, g, u, d = make_layer(T, H, E, I)
    sg, su, sd = (torch.randn(*s, **d64) / 3 for s in ((2, H), (2, H), (H, 2)))
    res = torch.randn(T, H, **d64)
    wl = torch.randn(T, E, dtype=torch.float64)  # a loss on the router logits too (aux / z style)

    def f(x, R, g, u, d, sg, su, sd, res):
        y, logits, *_ = moe.moe_ffn(x.float(), R.float(), (g.float(), u.float(), d.float()), k=K, norm_topk_prob=True,
                                    shared=(sg.float(), su.float(), sd.float()), residual=res.float())
        return y.double(), (logits.double() * wl).sum()
    assert gradcheck(f, x, R, g, u, d, sg, su, sd, res, fast=True)


@need("moe_ffn_backward")
@pytest.mark.parametrize("router_type,kw", [("softmax", dict(capacity_factor=1.0)), ("softmax_v2", dict(renorm=1)),
                                            ("gating_top_k", dict(norm_type=1, routed_scaling_factor=1.5))])
def test_moe_ffn_gradcheck_routers_and_capacity(router_type, kw):
    x, R, g, u, d = make_layer(6, 5, 4, 3, seed=1)
    f = lambda *a: moe.moe_ffn(a[0].float(), a[1].float(), tuple(t.float() for t in a[2:]), k=2,
                               router_type=router_type, **kw)[0].double()
    assert gradcheck(f, x, R, g, u, d, fast=True)


def hf_grads(x, R, g, u, d, K, norm, dy, capacity=None):
    """Gradients of <HF loop(x), dy> in float64 (the plain-PyTorch twin)."""
    leaves = [t.detach().double().requires_grad_() for t in (x, R, g, u, d)]
    y, *_ = hf_moe(*leaves, K, norm, capacity=capacity)
    (y * dy.double()).sum().backward()
    return y, [t.grad for t in leaves]


@need("moe_ffn_backward")
def test_moe_ffn_bf16_realistic_grads():
    T, H, E, I, K = 64, 256, 16, 128, 4
    leaves = make_layer(T, H, E, I, dtype=torch.bfloat16, seed=2)
    dy = torch.randn(T, H).bfloat16()
    y, *_ = moe.moe_ffn(leaves[0], leaves[1], leaves[2:], k=K, norm_topk_prob=True)
    (y.float() * dy.float()).sum().backward()
    ry, want = hf_grads(*leaves, K, True, dy)
    assert rel_err(y, ry) < 3e-2
    for name, t, w in zip(("x", "router", "gate", "up", "down"), leaves, want):
        assert t.grad.dtype == torch.bfloat16 and rel_err(t.grad, w) < 4e-2, name


@need("moe_ffn_backward")
def test_moe_ffn_backward_weight_grad_dtype():
    """bf16 expert gradients are the fp32 ones rounded once (what .to(bf16) gives), in both layouts."""
    x, R, g, u, d = (t.detach().bfloat16() for t in make_layer(16, 32, 4, 24, seed=3))
    dy = torch.randn(16, 32).bfloat16()
    for layout, w in (("torch", (g, u, d)), ("EHI", tuple(t.transpose(1, 2).contiguous() for t in (g, u, d)))):
        saved = ot.ops.moe_ffn_forward_train(x, R, *w, k=2, layout=layout)[6]
        f32 = ot.ops.moe_ffn_backward(dy, x, R, *w, saved, layout=layout)
        b16 = ot.ops.moe_ffn_backward(dy, x, R, *w, saved, layout=layout, weight_grad_dtype=torch.bfloat16)
        for i in (2, 3, 4):  # d_gate, d_up, d_down
            assert f32[i].dtype == torch.float32 and b16[i].dtype == torch.bfloat16 and b16[i].shape == f32[i].shape
            assert torch.equal(b16[i], f32[i].bfloat16()), (layout, i)
        assert torch.equal(b16[0], f32[0]) and torch.equal(b16[1], f32[1])  # dx, d router unchanged
        with pytest.raises(RuntimeError, match="weight_grad_dtype"):
            ot.ops.moe_ffn_backward(dy, x, R, *w, saved, layout=layout, weight_grad_dtype=torch.float16)
    # the autograd path hands bf16 experts bf16 gradients (the library's, no fp32 round trip)
    leaves = [t.clone().requires_grad_() for t in (x, R, g, u, d)]
    y, *_ = moe.moe_ffn(leaves[0], leaves[1], tuple(leaves[2:]), k=2)
    (y.float() * dy.float()).sum().backward()
    saved = ot.ops.moe_ffn_forward_train(x, R, g, u, d, k=2)[6]
    want = ot.ops.moe_ffn_backward(dy, x, R, g, u, d, saved)
    for t, w in zip(leaves[2:], want[2:5]):
        assert t.grad.dtype == torch.bfloat16 and torch.equal(t.grad, w.bfloat16())


# ---- modules vs their plain-PyTorch twins ---------------------------------------------------------

@need("moe_ffn_backward")
@pytest.mark.parametrize("kind,cf", [(QwenExpert, None), (MixtralExpert, 1.0)])
def test_expert_parallel_trains_like_hf_loop(kind, cf):
    H, I, E, K, T = 32, 16, 6, 2, 12
    experts = [kind(H, I) for _ in range(E)]
    m = moe.ExpertParallel(experts, top_k=K, capacity_factor=cf, precision="fp32")
    x = torch.randn(3, 4, H, requires_grad=True)
    dy = torch.randn(3, 4, H)
    y = m(x)
    ((y * dy).sum() + m.aux_loss).backward()
    names = ("gate_proj", "up_proj", "down_proj") if kind is QwenExpert else ("w1", "w3", "w2")
    st = lambda n: torch.stack([getattr(e, n).weight.detach() for e in experts]).double().requires_grad_()
    leaves = [x.detach().reshape(T, H).double().requires_grad_(), m.gate.weight.detach().double().requires_grad_()]
    leaves += [st(n) for n in names]
    cap = None if cf is None else math.ceil(T * K / E * cf)
    ry, logits, _, _, counts = hf_moe(*leaves, K, False, capacity=cap)
    aux = E / (K * T * T) * (torch.softmax(logits, -1).sum(0) * counts).sum()
    ((ry * dy.reshape(T, H).double()).sum() + aux).backward()
    assert rel_err(y.reshape(T, H), ry) < 1e-4 and m.dropped == (0 if cf is None else int((counts - cap).clamp_min(0).sum()))
    assert rel_err(x.grad.reshape(T, H), leaves[0].grad) < 1e-4
    assert rel_err(m.gate.weight.grad, leaves[1].grad) < 1e-4
    for n, ref in zip(names, leaves[2:]):
        got = torch.stack([getattr(e, n).weight.grad for e in experts])
        assert rel_err(got, ref.grad) < 1e-4, n
    with torch.no_grad():  # the packed copy follows a parameter change made after a training step
        for e in experts:
            getattr(e, names[2]).weight.mul_(2)
        y2 = m(x)
    assert rel_err(y2.reshape(T, H), hf_moe(*(t.detach() for t in leaves[:4]), st(names[2]).detach(), K, False,
                                              capacity=cap)[0]) < 1e-4


@need("moe_ffn_backward")
def test_sparse_moe_block_bf16_trains_like_hf_loop():
    H, E, I, K, T = 256, 16, 128, 4, 64
    blk = moe.SparseMoeBlock(H, E, I, K, dtype=torch.bfloat16)
    x = torch.randn(2, T // 2, H).bfloat16().requires_grad_()
    dy = torch.randn(2, T // 2, H).bfloat16()
    y, logits = blk(x)
    assert logits.requires_grad and logits.shape == (T, E)
    (y.float() * dy.float()).sum().backward()
    st = lambda n: torch.stack([getattr(e, n).weight.detach() for e in blk.experts])
    ry, want = hf_grads(x.detach().reshape(T, H), blk.gate.weight.detach(), st("gate_proj"), st("up_proj"),
                        st("down_proj"), K, True, dy.reshape(T, H))
    assert rel_err(y.reshape(T, H), ry) < 3e-2
    assert rel_err(x.grad.reshape(T, H), want[0]) < 4e-2 and rel_err(blk.gate.weight.grad, want[1]) < 4e-2
    for n, w in zip(("gate_proj", "up_proj", "down_proj"), want[2:]):
        assert rel_err(torch.stack([getattr(e, n).weight.grad for e in blk.experts]), w) < 4e-2, n


# ---- bad input -----------------------------------------------------------------------------------

@need("moe_ffn_backward", "moe_token_permute_backward")
def test_backward_bad_inputs_name_the_argument():
    x, R, g, u, d = (t.detach().float() for t in make_layer(4, 6, 4, 3))
    with pytest.raises(RuntimeError, match="layout"):
        ot.ops.moe_ffn_forward_train(x, R, g, u, d, layout="NHWC")
    with pytest.raises(RuntimeError, match="'x'"):  # hidden size mismatch with the experts
        ot.ops.moe_ffn_forward_train(torch.randn(4, 5), R, g, u, d)
    out = ot.ops.moe_ffn_forward_train(x, R, g, u, d, k=2)
    with pytest.raises(RuntimeError, match="saved"):  # saved state of another batch
        ot.ops.moe_ffn_backward(torch.randn(5, 6), torch.randn(5, 6), R, g, u, d, out[6])
    with pytest.raises(RuntimeError, match="dy"):
        ot.ops.moe_ffn_backward(torch.randn(3, 6), x, R, g, u, d, out[6])
    with pytest.raises(RuntimeError, match="sorted_indices"):  # int64 indices
        ot.ops.moe_token_permute_backward(torch.randn(8, 6), torch.arange(8), 2)
    with pytest.raises(RuntimeError, match="expert_idx"):     # id out of range
        ot.ops.moe_gating_top_k_softmax_backward(torch.randn(4, 2), torch.randn(4, 4), torch.full((4, 2), 7, dtype=i32))


def test_shared_expert_storage_reads_the_experts_in_place():
    """SparseMoeBlock keeps each projection's expert weights in one buffer: the training step reads
    them stacked without a copy, and its gradients equal those of the copying path."""
    from ops_transformer import moe as moe_mod
    torch.manual_seed(4)
    block = moe_mod.SparseMoeBlock(32, 4, 24, 2)
    ws = [e.gate_proj.weight for e in block.experts]
    assert moe_mod._consecutive(ws)
    x = torch.randn(10, 32, requires_grad=True)
    dy = torch.randn(10, 32)
    (block(x)[0] * dy).sum().backward()
    shared = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    for e in block.experts:  # separate storages: the stack copies
        for name in ("gate_proj", "up_proj", "down_proj"):
            lin = getattr(e, name)
            lin.weight = torch.nn.Parameter(lin.weight.detach().clone())
    assert not moe_mod._consecutive([e.gate_proj.weight for e in block.experts])
    block.zero_grad(set_to_none=True)
    x.grad = None
    (block(x)[0] * dy).sum().backward()
    for got, want in zip(shared, [p.grad for p in block.parameters()] + [x.grad]):
        assert torch.equal(got, want)
