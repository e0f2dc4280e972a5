"""MoE ops and modules against plain-PyTorch references (HF-style loop over experts)."""
import math

import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import need, rel_err
from moe_reference import MixtralExpert, QwenExpert, expert_ffn, hf_moe, stable_sort_ids

moe = ot.moe
i32 = torch.int32


# ---- routers -----------------------------------------------------------------------------------

@need("moe_gating_top_k_softmax")
@pytest.mark.parametrize("shape", [(7, 16), (2, 3, 8)])
def test_gating_top_k_softmax(shape):
    x = torch.randn(*shape)
    k = 3
    y, idx, row = moe.moe_gating_top_k_softmax(x, None, k)
    p = torch.softmax(x, -1)
    wv, wi = torch.topk(p, k, -1)
    R = x.numel() // shape[-1]
    assert torch.allclose(y, wv, atol=1e-6) and torch.equal(idx, wi.int())
    assert torch.equal(row.reshape(R, k), torch.arange(R * k, dtype=i32).reshape(k, R).t())
    fin = torch.zeros(shape[:-1], dtype=torch.bool)
    fin.view(-1)[1] = True
    _, idx2, _ = moe.moe_gating_top_k_softmax(x, fin, k)
    assert (idx2.reshape(R, k)[1] == shape[-1]).all() and torch.equal(idx2.reshape(R, k)[0], idx.reshape(R, k)[0])


@need("moe_gating_top_k_softmax_v2")
def test_gating_top_k_softmax_v2_renorm_modes():
    x = torch.randn(9, 12)
    y, idx, sm = moe.moe_gating_top_k_softmax_v2(x, k=4, renorm=0, output_softmax=True)
    assert rel_err(sm, torch.softmax(x, -1)) < 1e-6
    assert rel_err(y, torch.topk(torch.softmax(x, -1), 4).values) < 1e-6
    y1, idx1, sm1 = moe.moe_gating_top_k_softmax_v2(x, k=4, renorm=1)
    tv, ti = torch.topk(x, 4)
    assert rel_err(y1, torch.softmax(tv, -1)) < 1e-6 and torch.equal(idx1, ti.int()) and sm1 is None


@need("moe_gating_top_k")
@pytest.mark.parametrize("norm_type", [0, 1])
def test_gating_top_k_groups_bias(norm_type):
    T, E, G, kg, k = 6, 16, 4, 2, 4
    x, bias = torch.randn(T, E), torch.randn(E) * 0.1
    y, idx, out = moe.moe_gating_top_k(x, k, bias=bias, k_group=kg, group_count=G, group_select_mode=1,
                                       norm_type=norm_type, out_flag=True, routed_scaling_factor=2.5)
    s = torch.sigmoid(x) if norm_type else torch.softmax(x, -1)
    sb = (s + bias).reshape(T, G, E // G)
    grp = sb.topk(2, -1).values.sum(-1)
    keep = torch.zeros(T, G, dtype=torch.bool).scatter_(1, grp.topk(kg, -1).indices, True)
    sel = sb.masked_fill(~keep[..., None], -math.inf).reshape(T, E)
    ids = sel.topk(k, -1).indices
    w = s.gather(1, ids)
    if norm_type:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    assert torch.equal(idx, ids.int()) and rel_err(y, w * 2.5) < 1e-6 and rel_err(out, s) < 1e-6


# ---- routing -----------------------------------------------------------------------------------

@need("moe_init_routing")
def test_init_routing_v1():
    N, K, H = 5, 2, 8
    x = torch.randn(N, H)
    ids = torch.randint(0, 4, (N, K), dtype=i32)
    row = torch.arange(N * K, dtype=i32).reshape(K, N).t().contiguous()
    ex, erow, eexp = moe.moe_init_routing(x, row, ids, 3)
    sorted_ids, perm = stable_sort_ids(ids)
    src = row.reshape(-1)[perm].long()
    want_row = torch.empty(N * K, dtype=torch.long)
    want_row[src] = torch.arange(N * K)
    assert torch.equal(eexp, sorted_ids.int()) and torch.equal(erow, want_row.int())
    assert ex.shape == (3 * K, H) and torch.equal(ex, x[src[:3 * K] % N])


@need("moe_init_routing_v2")
@pytest.mark.parametrize("count_type", [0, 1])
def test_init_routing_v2_dropless(count_type):
    N, K, H, E = 7, 3, 16, 5
    x = torch.randn(N, H).bfloat16()
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(N)]).int()
    ex, erow, tokens, scale = moe.moe_init_routing_v2(x, ids, active_num=N * K, expert_num=E,
                                                      expert_tokens_num_type=count_type, expert_tokens_num_flag=True)
    _, perm = stable_sort_ids(ids)
    assert torch.equal(ex, x[perm // K])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(N * K)
    assert torch.equal(erow, inv.int())
    counts = torch.bincount(ids.reshape(-1).long(), minlength=E)
    assert torch.equal(tokens.long(), counts.cumsum(0) if count_type == 0 else counts)
    assert scale is None


@need("moe_init_routing_v2")
def test_init_routing_v2_drop_pad_and_quant():
    N, K, H, E, C = 6, 2, 8, 3, 2
    x = torch.randn(N, H)
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 2], [0, 2], [2, 1]], dtype=i32)
    ex, erow, _, _ = moe.moe_init_routing_v2(x, ids, expert_capacity=C, expert_num=E, drop_pad_mode=1)
    assert ex.shape == (E, C, H)
    slot = torch.zeros(E, dtype=torch.long)
    for j, e in enumerate(ids.reshape(-1).long().tolist()):   # token-major order = sort order per expert
        if slot[e] < C:
            assert erow[j] == e * C + slot[e] and torch.equal(ex[e, slot[e]], x[j // K])
            slot[e] += 1
        else:
            assert erow[j] == -1
    q, _, _, dscale = moe.moe_init_routing_v2(x, ids, active_num=N * K, expert_num=E, quant_mode=1)
    assert q.dtype == torch.int8 and dscale.shape == (N * K,)
    _, perm = stable_sort_ids(ids)
    assert rel_err(q.float() * dscale[:, None], x[perm // K]) < 1e-2


@need("moe_compute_expert_tokens")
def test_compute_expert_tokens():
    s = torch.tensor([0, 0, 2, 2, 2, 3], dtype=i32)
    assert moe.moe_compute_expert_tokens(s, 5).tolist() == [2, 2, 5, 6, 6]


@need("moe_token_permute", "moe_token_unpermute")
def test_token_permute_unpermute_roundtrip():
    T, K, H, E = 9, 2, 8, 4
    x = torch.randn(T, H)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)]).int()
    probs = torch.rand(T, K)
    perm_x, sidx = moe.moe_token_permute(x, ids)
    _, perm = stable_sort_ids(ids)
    assert torch.equal(perm_x, x[perm // K])
    out = moe.moe_token_unpermute(perm_x, sidx, probs)
    assert rel_err(out, x * probs.sum(-1, keepdim=True)) < 1e-6


@need("moe_re_routing")
def test_re_routing_blocks_by_expert():
    R, El, H = 2, 3, 4
    counts = torch.tensor([[1, 0, 2], [2, 1, 0]], dtype=i32)
    A = int(counts.sum())
    tok = torch.randn(A, H)
    out, sc, idx, num = moe.moe_re_routing(tok, counts, per_token_scales=torch.rand(A))
    src = []  # rows are [rank][expert] blocks; output is [expert][rank]
    off = counts.reshape(-1).cumsum(0) - counts.reshape(-1)
    for e in range(El):
        for r in range(R):
            src += list(range(int(off[r * El + e]), int(off[r * El + e] + counts[r, e])))
    assert torch.equal(idx.long(), torch.tensor(src)) and torch.equal(out, tok[src])
    assert torch.equal(num.long(), counts.sum(0).long())


# ---- grouped matmul, finalize, per-token mm -------------------------------------------------------

@need("grouped_matmul")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gl_type", [0, 1, 2])
def test_grouped_matmul(dtype, gl_type):
    G, K, N = 4, 32, 24
    sizes = [3, 0, 7, 5]
    M = sum(sizes)
    x, w = torch.randn(M, K).to(dtype), torch.randn(G, K, N).to(dtype)
    b = torch.randn(G, N)
    gl = {0: torch.tensor(sizes).cumsum(0), 1: torch.tensor(sizes),
          2: torch.tensor([[g, s] for g, s in enumerate(sizes)])}[gl_type]
    (y,) = moe.grouped_matmul([x], [w], bias=[b], group_list=gl, group_list_type=gl_type, split_item=2, group_type=0)
    want, off = [], 0
    for g, s in enumerate(sizes):
        want.append(x[off:off + s].double() @ w[g].double() + b[g].double())
        off += s
    assert y.dtype == dtype and rel_err(y, torch.cat(want)) < (1e-5 if dtype == torch.float32 else 1e-2)
    parts = moe.grouped_matmul([x], list(w.unbind(0)), bias=list(b.unbind(0)), group_list=gl,
                               group_list_type=gl_type, split_item=0)
    assert [p.shape[0] for p in parts] == sizes and torch.equal(torch.cat(parts), y)


@need("grouped_matmul")
def test_grouped_matmul_swiglu_and_transposed_weight():
    sizes, K, I = [4, 6], 16, 8
    x = torch.randn(10, K)
    w_torch = torch.randn(2, 2 * I, K)  # [G, N, K] as stacked nn.Linear weights
    (y,) = moe.grouped_matmul([x], [w_torch.transpose(1, 2)], group_list=torch.tensor(sizes), group_list_type=1,
                              split_item=3, act_type=6)
    z = torch.cat([x[:4] @ w_torch[0].t(), x[4:] @ w_torch[1].t()])
    assert rel_err(y, F.silu(z[:, :I]) * z[:, I:]) < 1e-5


@need("moe_finalize_routing", "moe_finalize_routing_v2")
def test_finalize_routing():
    N, K, H, E = 6, 2, 8, 4
    rows = torch.randn(N * K, H)
    skip1, skip2, bias = torch.randn(N, H), torch.randn(N, H), torch.randn(E, H)
    scales = torch.rand(N, K)
    ids = torch.randint(0, E, (N, K), dtype=i32)
    erow = torch.randperm(N * K).int()
    want = skip1 + skip2
    for n in range(N):
        for k in range(K):
            want[n] += scales[n, k] * (rows[erow[k * N + n]] + bias[ids[n, k]])
    out = moe.moe_finalize_routing(rows, skip1, skip2, bias, scales, erow, ids)
    assert rel_err(out, want) < 1e-6
    out2 = moe.moe_finalize_routing_v2(rows, erow, x1=skip1, x2=skip2, bias=bias, scales=scales, expert_idx=ids)
    assert rel_err(out2, want) < 1e-6


@need("moe_final_optimizer_mm")
def test_final_optimizer_mm():
    x, w = torch.randn(5, 16), torch.randn(3, 16, 8)
    idx = torch.tensor([2, 0, 0, 1, 2], dtype=i32)
    y = moe.moe_final_optimizer_mm(x, w, idx)
    assert rel_err(y, torch.einsum("th,thi->ti", x, w[idx.long()])) < 1e-5


# ---- losses -----------------------------------------------------------------------------------

@need("moe_aux_loss", "moe_z_loss", "moe_capacity")
def test_losses_values_and_gradients():
    T, E, K = 10, 6, 2
    logits = torch.randn(T, E, requires_grad=True)
    probs = torch.softmax(logits, -1)
    counts = torch.randint(0, 5, (E,))
    aux = moe.moe_aux_loss(probs, counts, K, 0.01)
    want = 0.01 * E / (K * T * T) * (probs.sum(0) * counts).sum()
    assert abs(aux.item() - want.item()) < 1e-6
    g1, = torch.autograd.grad(aux, logits, retain_graph=True)
    g2, = torch.autograd.grad(want, logits)
    assert rel_err(g1, g2) < 1e-5
    z = moe.moe_z_loss(logits, 0.1)
    zw = 0.1 * (torch.logsumexp(logits, -1) ** 2).mean()
    assert abs(z.item() - zw.item()) < 1e-5
    assert rel_err(torch.autograd.grad(z, logits, retain_graph=True)[0], torch.autograd.grad(zw, logits)[0]) < 1e-5
    assert moe.moe_capacity(100, 2, 8, 1.2) == math.ceil(100 * 2 / 8 * 1.2)


# ---- fused layer and expert store --------------------------------------------------------------

def make_experts(E, H, I, dtype=torch.float32):
    g = torch.randn(E, I, H) / math.sqrt(H)
    u = torch.randn(E, I, H) / math.sqrt(H)
    d = torch.randn(E, H, I) / math.sqrt(I)
    return g.to(dtype), u.to(dtype), d.to(dtype)


@need("moe_ffn")
@pytest.mark.parametrize("dtype,T,E,K,norm", [(torch.float32, 13, 8, 2, True), (torch.float32, 1, 4, 4, False),
                                              (torch.bfloat16, 64, 16, 4, True), (torch.float32, 0, 4, 2, False)])
def test_moe_ffn_vs_hf_loop(dtype, T, E, K, norm):
    H, I = 64, 32
    x = torch.randn(T, H).to(dtype)
    gate = (torch.randn(E, H) / 8).to(dtype)
    g, u, d = make_experts(E, H, I, dtype)
    y, logits, ids, w, counts, dropped = moe.moe_ffn(x, moe.PackedWeight(gate), moe.MoeExperts(g, u, d), k=K,
                                                     norm_topk_prob=norm)
    ry, rlogits, rids, rw, rcounts = hf_moe(x, gate, g, u, d, K, norm)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert y.shape == (T, H) and y.dtype == dtype and dropped == 0
    if T:
        assert rel_err(y, ry) < tol and rel_err(logits, rlogits) < tol and torch.equal(counts, rcounts)


@need("moe_ffn")
def test_moe_ffn_capacity_shared_residual():
    T, H, I, E, K = 40, 32, 16, 4, 2
    x, gate = torch.randn(T, H), torch.randn(E, H)
    g, u, d = make_experts(E, H, I)
    sg, su, sd = make_experts(1, H, I)
    res = torch.randn(T, H)
    C = moe.moe_capacity(T, K, E, 0.5)
    y, *_, counts, dropped = moe.moe_ffn(x, moe.PackedWeight(gate), moe.MoeExperts(g, u, d), k=K, expert_capacity=C,
                                         shared=moe.MoeExperts(sg, su, sd), residual=res)
    ry, _, _, _, rc = hf_moe(x, gate, g, u, d, K, False, capacity=C)
    want = ry + expert_ffn(x.double(), sg[0].double(), su[0].double(), sd[0].double()) + res.double()
    assert dropped == int((rc - C).clamp_min(0).sum()) and dropped > 0
    assert rel_err(y, want) < 1e-4


@need("moe_ffn")
def test_expert_store_hot_update():
    T, H, I, E = 20, 32, 16, 3
    x, gate = torch.randn(T, H), torch.randn(E + 1, H)
    g, u, d = make_experts(E + 1, H, I)
    store = moe.MoeExperts(g[:E], u[:E], d[:E])
    store.set_expert(E, g[E], u[E], d[E], "torch")  # grow to E + 1
    assert store.num_experts() == E + 1 and store.packed_bytes() > 0
    y, *_ = moe.moe_ffn(x, moe.PackedWeight(gate), store, k=2)
    assert rel_err(y, hf_moe(x, gate, g, u, d, 2, False)[0]) < 1e-4
    g2, u2, d2 = make_experts(1, H, I)
    store.set_expert(1, g2[0], u2[0], d2[0], "torch")  # replace expert 1 only
    g[1], u[1], d[1] = g2[0], u2[0], d2[0]
    y, *_ = moe.moe_ffn(x, moe.PackedWeight(gate), store, k=2)
    assert rel_err(y, hf_moe(x, gate, g, u, d, 2, False)[0]) < 1e-4
    store.remove_expert(E)
    assert store.num_experts() == E


# ---- bad input ------------------------------------------------------------------------------------

@need("moe_init_routing_v2", "moe_gating_top_k_softmax", "grouped_matmul", "moe_ffn")
def test_bad_inputs_raise_and_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="expert_idx"):   # int64 ids
        moe.moe_init_routing_v2(x, torch.zeros(4, 2, dtype=torch.int64), expert_num=4)
    with pytest.raises(RuntimeError, match="expert_idx"):   # id out of range
        moe.moe_init_routing_v2(x, torch.full((4, 2), 9, dtype=i32), expert_num=4)
    with pytest.raises(RuntimeError, match="'k'"):           # k > E
        moe.moe_gating_top_k_softmax(torch.randn(3, 4), None, 5)
    nan = torch.randn(3, 4)
    nan[1, 2] = float("nan")
    with pytest.raises(RuntimeError, match="'x'"):           # NaN scores
        moe.moe_gating_top_k_softmax(nan, None, 2)
    with pytest.raises(RuntimeError, match="'group_list'.*non-decreasing"):  # not monotone, yet ending at M = 6
        moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 4, 4)], group_list=torch.tensor([7, 6]), split_item=2)
    with pytest.raises(RuntimeError, match="'group_list'.*summing to the rows"):  # does not sum to the rows
        moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 4, 4)], group_list=torch.tensor([1, 2]),
                           group_list_type=1, split_item=2)
    with pytest.raises(RuntimeError, match="'weight'|'x'"):  # K mismatch
        moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 5, 4)], group_list=torch.tensor([3, 6]), split_item=2)
    g, u, d = make_experts(2, 8, 4)
    with pytest.raises(RuntimeError, match="'x'"):           # hidden size mismatch with the experts
        moe.moe_ffn(torch.randn(3, 6), moe.PackedWeight(torch.randn(2, 6)), moe.MoeExperts(g, u, d))
    with pytest.raises(RuntimeError, match="router_type"):
        moe.moe_ffn(torch.randn(3, 8), moe.PackedWeight(torch.randn(2, 8)), moe.MoeExperts(g, u, d), router_type="x")


# Each case breaks one rule (a wrong dtype or shape of one argument); the error must be a
# RuntimeError naming that argument, as "argument '<name>'" in the library's message.
def _bad_cases():
    x, ids = torch.randn(4, 8), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=i32)
    row = torch.arange(8, dtype=i32).reshape(2, 4).t().contiguous()
    g, u, d = make_experts(2, 8, 4)
    return [
        ("gating x int32", lambda: moe.moe_gating_top_k_softmax(torch.zeros(3, 4, dtype=i32), None, 2), "x"),
        ("gating x 1-D", lambda: moe.moe_gating_top_k_softmax(torch.randn(4), None, 2), "x"),
        ("gating finished shape", lambda: moe.moe_gating_top_k_softmax(torch.randn(3, 4), torch.zeros(2, dtype=torch.bool), 2),
         "finished"),
        ("gating_top_k bias shape", lambda: moe.moe_gating_top_k(torch.randn(3, 4), 2, bias=torch.randn(5)), "bias"),
        ("init v1 row_idx int64", lambda: moe.moe_init_routing(x, row.long(), ids, 4), "row_idx"),
        ("init v1 row_idx shape", lambda: moe.moe_init_routing(x, row[:, :1].contiguous(), ids, 4), "row_idx"),
        ("init v2 x int32", lambda: moe.moe_init_routing_v2(x.int(), ids, expert_num=4), "x"),
        ("init v2 expert_idx rows", lambda: moe.moe_init_routing_v2(x, ids[:3], expert_num=4), "expert_idx"),
        ("init v2 scale shape", lambda: moe.moe_init_routing_v2(x, ids, scale=torch.rand(3), expert_num=4), "scale"),
        ("permute indices int64", lambda: moe.moe_token_permute(x, ids.long()), "indices"),
        ("permute indices rows", lambda: moe.moe_token_permute(x, ids[:3]), "indices"),
        ("unpermute sorted_indices int64",
         lambda: moe.moe_token_unpermute(torch.randn(8, 8), torch.arange(8), torch.rand(4, 2)), "sorted_indices"),
        ("unpermute probs shape",
         lambda: moe.moe_token_unpermute(torch.randn(8, 8), torch.arange(8, dtype=i32), torch.rand(3, 2)), "sorted_indices"),
        ("expert tokens int64", lambda: moe.moe_compute_expert_tokens(torch.tensor([0, 1, 1]), 3), "sorted_experts"),
        ("re_routing scales dtype",
         lambda: moe.moe_re_routing(torch.randn(3, 4), torch.tensor([[1, 2]], dtype=i32),
                                    per_token_scales=torch.rand(3, dtype=torch.bfloat16)), "per_token_scales"),
        ("gmm weight dtype", lambda: moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 4, 4, dtype=torch.bfloat16)],
                                                        group_list=torch.tensor([2, 6]), split_item=2), "weight"),
        ("gmm group_list float", lambda: moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 4, 4)],
                                                            group_list=torch.tensor([2.0, 6.0]), split_item=2), "group_list"),
        ("gmm bias shape", lambda: moe.grouped_matmul([torch.randn(6, 4)], [torch.randn(2, 4, 4)], bias=[torch.randn(2, 3)],
                                                      group_list=torch.tensor([2, 6]), split_item=2), "bias"),
        ("finalize row idx int64", lambda: moe.moe_finalize_routing_v2(torch.randn(4, 8), torch.arange(4),
                                                                       scales=torch.rand(2, 2)), "expanded_row_idx"),
        ("finalize x1 dtype", lambda: moe.moe_finalize_routing_v2(torch.randn(4, 8), torch.arange(4, dtype=i32),
                                                                  x1=torch.randn(2, 8, dtype=torch.bfloat16),
                                                                  scales=torch.rand(2, 2)), "x1"),
        ("final mm idx int64", lambda: moe.moe_final_optimizer_mm(torch.randn(2, 4), torch.randn(3, 4, 2), torch.tensor([0, 1])),
         "token_expert_idx"),
        ("final mm weight H", lambda: moe.moe_final_optimizer_mm(torch.randn(2, 4), torch.randn(3, 5, 2),
                                                                 torch.tensor([0, 1], dtype=i32)), "expert_weight"),
        ("aux loss counts shape", lambda: moe.moe_aux_loss(torch.rand(4, 3), torch.tensor([1, 2], dtype=i32), 1),
         "tokens_per_expert"),
        ("moe_ffn x dtype", lambda: moe.moe_ffn(torch.randn(3, 8, dtype=torch.bfloat16), moe.PackedWeight(torch.randn(2, 8)),
                                                moe.MoeExperts(g, u, d)), "experts"),
        ("moe_ffn residual shape", lambda: moe.moe_ffn(torch.randn(3, 8), moe.PackedWeight(torch.randn(2, 8)),
                                                       moe.MoeExperts(g, u, d), k=1, residual=torch.randn(2, 8)), "residual"),
        ("moe_ffn capacity_factor nan", lambda: moe.moe_ffn(torch.randn(3, 8), moe.PackedWeight(torch.randn(2, 8)),
                                                            moe.MoeExperts(g, u, d), k=1, capacity_factor=float("nan")),
         "capacity_factor"),
        ("store set_expert up shape", lambda: moe.MoeExperts(g, u, d).set_expert(0, g[0], u[0][:, :7].contiguous(), d[0], "torch"),
         "up"),
    ]


@need("moe_init_routing_v2", "grouped_matmul", "moe_ffn", "moe_final_optimizer_mm", "moe_re_routing")
@pytest.mark.parametrize("case", range(len(_bad_cases())), ids=[c[0] for c in _bad_cases()])
def test_wrong_dtype_or_shape_names_the_argument(case):
    _, call, arg = _bad_cases()[case]
    with pytest.raises(RuntimeError, match=f"argument '{arg}'"):
        call()


# ---- modules ------------------------------------------------------------------------------------

@need("moe_ffn")
@pytest.mark.parametrize("kind", [QwenExpert, MixtralExpert])
def test_expert_parallel_module(kind):
    H, I, E, K = 32, 16, 6, 2
    experts = [kind(H, I) for _ in range(E)]
    m = moe.ExpertParallel(experts, top_k=K, capacity_factor=None, precision="fp32")
    x = torch.randn(2, 5, H)
    with torch.no_grad():
        y = m(x)
    names = ("gate_proj", "up_proj", "down_proj") if kind is QwenExpert else ("w1", "w3", "w2")
    st = lambda n: torch.stack([getattr(e, n).weight.detach() for e in experts])
    ry, rlogits, _, _, rc = hf_moe(x.reshape(-1, H), m.gate.weight.detach(), *(st(n) for n in names), K, False)
    assert y.shape == x.shape and rel_err(y.reshape(-1, H), ry) < 1e-4
    probs = torch.softmax(rlogits, -1)
    assert abs(m.aux_loss.item() - (E / (K * 100) * (probs.sum(0) * rc).sum()).item()) < 1e-5
    mb = moe.ExpertParallel(experts, top_k=K, capacity_factor=1.2)  # bf16, capacity from the factor
    with torch.no_grad():
        yb = mb(x)
    assert yb.dtype == x.dtype and mb.expert_counts.sum() == 10 * K


@need("moe_ffn")
def test_sparse_moe_block_loads_hf_and_mixtral_keys():
    H, E, I, K = 32, 8, 16, 2
    src = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True)
    keys = set(src.state_dict())
    assert "gate.weight" in keys and "experts.3.gate_proj.weight" in keys and "experts.7.down_proj.weight" in keys
    blk = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True)
    blk.load_state_dict(src.state_dict())
    x = torch.randn(3, 4, H)
    with torch.no_grad():
        y, logits = blk(x)
    st = lambda n: torch.stack([getattr(e, n).weight.detach() for e in src.experts])
    ry, rlogits, *_ = hf_moe(x.reshape(-1, H), src.gate.weight.detach(), st("gate_proj"), st("up_proj"),
                             st("down_proj"), K, True)
    assert rel_err(y.reshape(-1, H), ry) < 1e-4 and rel_err(logits, rlogits) < 1e-4
    mix = {"gate.weight": src.gate.weight.detach()}
    for i, e in enumerate(src.experts):
        mix[f"experts.{i}.w1.weight"] = e.gate_proj.weight.detach()
        mix[f"experts.{i}.w3.weight"] = e.up_proj.weight.detach()
        mix[f"experts.{i}.w2.weight"] = e.down_proj.weight.detach()
    blk2 = moe.SparseMoeBlock.from_mixtral_state_dict(mix, top_k=K)
    with torch.no_grad():
        assert torch.equal(blk2(x)[0], y)


@need("moe_ffn")
def test_ops_taking_packed_objects_skip_torch_function_lookups():
    """Ops with torch.classes arguments run with __torch_function__ off (its lookup on a ScriptObject
    throws a C++ exception every call): the results equal the raw op's, and the switch is restored."""
    from ops_transformer import _lib
    assert _lib.takes_script_objects("moe_ffn") and not _lib.takes_script_objects("matmul")
    H, E, I, K = 32, 8, 16, 2
    blk = moe.SparseMoeBlock(H, E, I, K, norm_topk_prob=True)
    x = torch.randn(5, H)
    with torch.no_grad():
        blk.repack()
        router = moe._RouterCache().get(blk.gate.weight, torch.float32)
        fast = moe._MOE_FFN(x, router, blk._packed, k=K, norm_topk_prob=True)
        raw = _lib.ops.moe_ffn.default._op(x, router, blk._packed, k=K, norm_topk_prob=True)
        for a, b in zip(fast, raw):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b)
    assert torch._C._is_torch_function_enabled()


@need("moe_ffn")
def test_sparse_moe_block_bf16_realistic():
    H, E, I, K = 256, 16, 128, 4
    blk = moe.SparseMoeBlock(H, E, I, K, dtype=torch.bfloat16)
    x = torch.randn(64, H).bfloat16()
    with torch.no_grad():
        y, _ = blk(x)
    st = lambda n: torch.stack([getattr(e, n).weight.detach() for e in blk.experts])
    ry, *_ = hf_moe(x, blk.gate.weight.detach(), st("gate_proj"), st("up_proj"), st("down_proj"), K, True)
    assert rel_err(y, ry) < 3e-2


# ---- backward ---------------------------------------------------------------------------------

def gmm_reference(x, w, b, sizes, act):
    out, off = [], 0
    for g, s in enumerate(sizes):
        z = x[off:off + s] @ w[g] + (0 if b is None else b[g])
        if act == 6:
            n = z.shape[1] // 2
            z = F.silu(z[:, :n]) * z[:, n:]
        elif act == 5:
            z = F.silu(z)
        elif act == 1:
            z = F.relu(z)
        out.append(z)
        off += s
    return torch.cat(out)


@need("grouped_matmul_backward")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", [0, 1, 5, 6])
def test_grouped_matmul_backward_vs_autograd(dtype, act):
    sizes, K, N = [5, 0, 9, 3], 24, 16
    G, M = len(sizes), sum(sizes)
    x, w, b = torch.randn(M, K).to(dtype), (torch.randn(G, K, N) / 5).to(dtype), torch.randn(G, N)
    dy = torch.randn(M, N // 2 if act == 6 else N).to(dtype)
    gl = torch.tensor(sizes).cumsum(0)
    dx, dw, db = ot.ops.grouped_matmul_backward(dy, x, w, gl, act_type=act, bias=b, need_dbias=True)
    ref = [t.double().requires_grad_() for t in (x, w, b)]
    gmm_reference(*ref, sizes, act).backward(dy.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert dx.dtype == dtype and dw.dtype == torch.float32
    assert rel_err(dx, ref[0].grad) < tol and rel_err(dw, ref[1].grad) < tol and rel_err(db, ref[2].grad) < tol
    assert dw[1].abs().max() == 0  # the empty group gets a zero gradient


@need("grouped_matmul", "grouped_matmul_backward")
def test_grouped_matmul_gradcheck():
    """gradcheck in float64 around the fp32 kernels (inputs rounded to fp32 inside; eps sized for that)."""
    sizes = torch.tensor([2, 3, 1])
    def f(x, w, b):
        (y,) = moe.grouped_matmul([x.float()], [w.float()], bias=[b.float()], group_list=sizes, group_list_type=1,
                                  split_item=2, act_type=6)
        return y.double()
    args = (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True),
            torch.randn(3, 8, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(f, args, eps=1e-3, atol=2e-3, rtol=2e-3)


@need("quantize_weights", "dequantize_weights")
def test_quantize_weights_rounding_and_layout():
    # Scale 1 (max |w| = 127): -63.5 is a tie and goes away from zero.
    q, s, o = moe.quantize_weights(torch.tensor([[127.0], [-63.5], [1.0]]), "int8")
    assert q.dtype == torch.int8 and q.tolist() == [[[127], [-64], [1]]] and s.tolist() == [[1.0]] and o is None
    # int4, N = 3 (a scale per column: codes -7, 7, -7): column 0 low nibble, column 1 high nibble of
    # byte 0; column 2 in byte 1.
    q4, s4, o4 = moe.quantize_weights(torch.tensor([[-7.0, 7.0, -1.0]]), "int4")
    assert q4.dtype == torch.uint8 and q4.shape == (1, 1, 2) and q4.flatten().tolist() == [0x79, 0x09]
    w = torch.randn(3, 128, 20)
    for fmt, gs in (("int8", 0), ("int4", 32), ("int4", 128)):
        for sym in (True, False):
            q, s, o = moe.quantize_weights(w, fmt, gs, sym)
            d = moe.dequantize_weights(q, s, o, gs)
            step = s if gs == 0 else s.repeat_interleave(gs, dim=1)
            step = step.unsqueeze(1) if gs == 0 else step
            assert ((d - w).abs() <= 0.5 * step + 1e-6).all()
    with pytest.raises(RuntimeError, match="group_size"):
        moe.quantize_weights(torch.randn(48, 4), "int4", 32)
    with pytest.raises(RuntimeError, match="format"):
        moe.quantize_weights(torch.randn(32, 4), "int2")


@need("quantize_weights", "grouped_matmul")
@pytest.mark.parametrize("fmt,gs,sym", [("int8", 0, True), ("int8", 0, False), ("int4", 64, True), ("int4", 32, False)])
def test_grouped_matmul_antiquant(fmt, gs, sym):
    sizes, K, N = [3, 0, 1, 9], 128, 46
    G, M = len(sizes), sum(sizes)
    w = torch.randn(G, K, N) * 0.05
    q, s, o = moe.quantize_weights(w, fmt, gs, sym)
    wd = moe.dequantize_weights(q, s, o, gs)
    x, b = torch.randn(M, K).bfloat16(), torch.randn(G, N)
    for act in (0, 6):
        (y,) = moe.grouped_matmul([x], [q], bias=[b], group_list=torch.tensor(sizes), group_list_type=1, split_item=2,
                                  act_type=act, antiquant_scale=[s], antiquant_offset=None if o is None else [o],
                                  antiquant_group_size=gs)
        want, off = [], 0
        for g, n in enumerate(sizes):
            z = x[off:off + n].double() @ wd[g].double() + b[g].double()
            want.append(F.silu(z[:, :N // 2]) * z[:, N // 2:] if act == 6 else z)
            off += n
        assert y.dtype == torch.bfloat16 and y.shape == (M, N // 2 if act == 6 else N)
        assert rel_err(y, torch.cat(want)) < 4e-3
    with pytest.raises(RuntimeError, match="antiquant_scale"):
        moe.grouped_matmul([x], [q], group_list=torch.tensor(sizes), group_list_type=1, split_item=2,
                           antiquant_scale=[s[:, :-1]], antiquant_group_size=gs)
