"""Gated DeltaNet ops and the GatedDeltaNet layer against the plain-PyTorch token recurrence."""
import pytest
import torch
import torch.nn.functional as F

import ops_transformer as ot
from conftest import need, rel_err
from gdn_reference import hf_gated_delta_net, l2n, recurrence

pytestmark = need("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
from ops_transformer import gdn

TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2}


def inputs(B, T, HK, HV, DK, DV, dtype=torch.float32, gmin=-3.0):
    q = torch.randn(B, T, HK, DK).to(dtype)
    k = l2n(torch.randn(B, T, HK, DK)).to(dtype)   # normalised keys keep (I + M) well conditioned
    v = torch.randn(B, T, HV, DV).to(dtype)
    g = torch.empty(B, T, HV).uniform_(gmin, 0)
    beta = torch.rand(B, T, HV)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,HK,HV,DK,DV,l2", [(1, 1, 1, 16, 16, False), (63, 2, 4, 32, 48, True),
                                              (65, 1, 2, 64, 32, False), (130, 2, 2, 32, 32, True)])
def test_chunk_vs_recurrence(dtype, T, HK, HV, DK, DV, l2):
    q, k, v, g, beta = inputs(2, T, HK, HV, DK, DV, dtype)
    h0 = torch.randn(2, HV, DK, DV) * 0.1
    o, final = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          use_qk_l2norm_in_kernel=l2)
    ro, rfinal = recurrence(q, k, v, g, beta, initial_state=h0, l2norm=l2)
    assert o.shape == v.shape and o.dtype == dtype and final.dtype == torch.float32
    assert rel_err(o, ro) < TOL[dtype] and rel_err(final, rfinal) < TOL[dtype]


def test_chunk_no_final_state_returns_none():
    q, k, v, g, beta = inputs(1, 10, 1, 1, 16, 16)
    o, final = gdn.chunk_gated_delta_rule(q, k, v, g, beta)
    assert final is None and rel_err(o, recurrence(q, k, v, g, beta)[0]) < 1e-4


def test_varlen_with_empty_and_one_token_sequences():
    cu = torch.tensor([0, 1, 1, 70, 100], dtype=torch.int64)
    q, k, v, g, beta = inputs(1, 100, 2, 4, 32, 32, gmin=-20.0)
    h0 = torch.randn(4, 4, 32, 32) * 0.1
    o, final = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    ro, rfinal = recurrence(q, k, v, g, beta, initial_state=h0, l2norm=True, cu_seqlens=cu)
    assert rel_err(o, ro) < 2e-4 and rel_err(final, rfinal) < 2e-4
    assert torch.equal(final[1], h0[1])  # the empty sequence keeps its state
    o32, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu.int(),
                                        use_qk_l2norm_in_kernel=True)
    assert torch.equal(o32, o)


def test_head_major_layout_reads_strides():
    q, k, v, g, beta = inputs(2, 70, 2, 4, 32, 16)
    o, f = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    t = lambda x: x.transpose(1, 2)  # BTHD -> BNSD as a strided view (no copy)
    ob, fb = gdn.chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), output_final_state=True, layout="BNSD")
    assert rel_err(ob.transpose(1, 2), o) < 1e-5 and rel_err(fb, f) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_recurrent_vs_recurrence(dtype):
    q, k, v, g, beta = inputs(3, 5, 2, 4, 32, 32, dtype)
    h0 = torch.randn(3, 4, 32, 32) * 0.1
    o, f = gdn.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    ro, rf = recurrence(q, k, v, g, beta, initial_state=h0, l2norm=True)
    assert rel_err(o, ro) < TOL[dtype] and rel_err(f, rf) < TOL[dtype]


def test_fused_gates_in_recurrent():
    q, k, v, _, _ = inputs(2, 3, 1, 2, 16, 16)
    a, b = torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    A_log, dt_bias = torch.rand(2) * 2, torch.randn(2)
    o, _ = gdn.fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, beta_sigmoid=True)
    g = -A_log.exp() * F.softplus(a + dt_bias)
    assert rel_err(o, recurrence(q, k, v, g, b.sigmoid())[0]) < 1e-4


def test_prefill_then_decode_equals_longer_prefill():
    q, k, v, g, beta = inputs(1, 70, 2, 4, 32, 32)
    o_full, f_full = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    _, state = gdn.chunk_gated_delta_rule(q[:, :66], k[:, :66], v[:, :66], g[:, :66], beta[:, :66],
                                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    outs = []
    for t in range(66, 70):
        s = slice(t, t + 1)
        o, state = gdn.fused_recurrent_gated_delta_rule(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], initial_state=state,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
        outs.append(o)
    assert rel_err(torch.cat(outs, 1), o_full[:, 66:]) < 1e-4 and rel_err(state, f_full) < 1e-4


def test_state_cache_decode_updates_slots_in_place():
    q, k, v, g, beta = inputs(1, 3, 1, 2, 16, 16)   # 3 sequences of 1 token, packed (varlen)
    cache = torch.randn(5, 2, 16, 16) * 0.1
    before = cache.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    o = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, cache, idx, cu_seqlens=torch.tensor([0, 1, 2, 3]))
    ro, rf = recurrence(q, k, v, g, beta, initial_state=before[idx.long()], cu_seqlens=[0, 1, 2, 3])
    assert rel_err(o, ro) < 1e-4 and rel_err(cache[idx.long()], rf) < 1e-4
    assert torch.equal(cache[[1, 3]], before[[1, 3]])  # untouched slots


@pytest.mark.parametrize("cu,msg", [([1, 5, 10], "cu_seqlens"), ([0, 6, 5, 10], "cu_seqlens"), ([0, 5, 9], "cu_seqlens")])
def test_bad_cu_seqlens(cu, msg):
    q, k, v, g, beta = inputs(1, 10, 1, 1, 16, 16)
    with pytest.raises(RuntimeError, match=msg):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor(cu))


def test_bad_inputs_name_the_argument():
    q, k, v, g, beta = inputs(1, 8, 2, 3, 16, 16)  # HV = 3 not a multiple of HK = 2
    with pytest.raises(RuntimeError, match="chunk_gated_delta_rule"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta)
    q, k, v, g, beta = inputs(1, 8, 1, 2, 16, 16)
    with pytest.raises(RuntimeError, match="'q'"):
        gdn.chunk_gated_delta_rule(q.double(), k, v, g, beta)
    with pytest.raises(RuntimeError, match="layout"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, layout="XYZ")
    bad = v.clone()
    bad[0, 3, 1, 2] = float("nan")
    with pytest.raises(RuntimeError):
        gdn.chunk_gated_delta_rule(q, k, bad, g, beta)
    cache = torch.zeros(4, 2, 16, 16)
    q1, k1, v1, g1, b1 = inputs(2, 1, 1, 2, 16, 16)
    with pytest.raises(RuntimeError, match="state_indices"):   # int64 ids
        gdn.recurrent_gated_delta_rule(q1, k1, v1, g1, b1, cache, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="state_indices"):   # out of range
        gdn.recurrent_gated_delta_rule(q1, k1, v1, g1, b1, cache, torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="state_indices"):   # duplicated
        gdn.recurrent_gated_delta_rule(q1, k1, v1, g1, b1, cache, torch.tensor([1, 1], dtype=torch.int32))


@need("l2norm_fwd", "chunk_local_cumsum", "chunk_scaled_dot_kkt_fwd", "solve_tril", "recompute_w_u_fwd",
      "chunk_gated_delta_rule_fwd_h", "chunk_fwd_o")
def test_stages_compose_to_the_chunked_forward():
    ops = ot.ops
    q, k, v, g, beta = inputs(1, 100, 2, 4, 32, 16)
    y, rstd = ops.l2norm_fwd(q)
    assert rel_err(y, l2n(q)) < 1e-6 and rel_err(rstd, 1 / torch.sqrt((q * q).sum(-1) + 1e-6)) < 1e-6
    assert rel_err(ops.l2norm_bwd(y, rstd, torch.ones_like(y)),
                   torch.autograd.functional.vjp(l2n, q.double(), torch.ones_like(q).double())[1]) < 1e-5
    G = ops.chunk_local_cumsum(g)
    want = torch.cat([g[:, s:s + 64].cumsum(1) for s in range(0, 100, 64)], 1)
    assert rel_err(G, want) < 1e-6
    R = ops.chunk_local_cumsum(g, reverse=True)
    want_r = torch.cat([g[:, s:s + 64].flip(1).cumsum(1).flip(1) for s in range(0, 100, 64)], 1)
    assert rel_err(R, want_r) < 1e-6
    M = ops.chunk_scaled_dot_kkt_fwd(k, G, beta)
    A = ops.solve_tril(M)
    w, u = ops.recompute_w_u_fwd(k, v, beta, A, G)
    h, v_new, final = ops.chunk_gated_delta_rule_fwd_h(k, w, u, G, None, True)
    o = ops.chunk_fwd_o(q, k, v_new, h, G)
    ro, rf = recurrence(q, k, v, g, beta)
    assert rel_err(o, ro) < 1e-4 and rel_err(final, rf) < 1e-4


def test_bf16_realistic_shape():
    q, k, v, g, beta = inputs(1, 256, 4, 8, 128, 128, torch.bfloat16)
    o, f = gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ro, rf = recurrence(q, k, v, g, beta, l2norm=True)
    assert rel_err(o, ro) < 2e-2 and rel_err(f, rf) < 2e-2


# ---- autograd ------------------------------------------------------------------------------

@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_chunk_gradients_match_recurrence():
    torch.manual_seed(1)
    q, k, v, g, beta = inputs(1, 20, 1, 2, 8, 8)
    h0 = torch.randn(1, 2, 8, 8) * 0.1
    args = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, f = gdn.chunk_gated_delta_rule(*args[:5], initial_state=args[5], output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)
    do, df = torch.randn_like(o), torch.randn_like(f)
    ((o * do).sum() + (f * df).sum()).backward()
    ref = [t.double().clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    ro, rf = recurrence(*ref[:5], initial_state=ref[5], l2norm=True)
    ((ro * do.double()).sum() + (rf * df.double()).sum()).backward()
    for a, r in zip(args, ref):
        assert rel_err(a.grad, r.grad) < 1e-3


@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_chunk_gradcheck_float64():
    """gradcheck in float64 around the fp32 kernels (inputs rounded to fp32 inside; eps sized for that)."""
    torch.manual_seed(3)
    q, k, v, g, beta = inputs(1, 6, 1, 2, 4, 4)
    h0 = torch.randn(1, 2, 4, 4) * 0.1

    def f(q, k, v, g, beta, h0):
        o, fin = gdn.chunk_gated_delta_rule(q.float(), k.float(), v.float(), g.float(), beta.float(),
                                            initial_state=h0.float(), output_final_state=True,
                                            use_qk_l2norm_in_kernel=True)
        return o.double(), fin.double()
    args = tuple(t.double().requires_grad_() for t in (q, k, v, g, beta, h0))
    assert torch.autograd.gradcheck(f, args, eps=1e-3, atol=3e-3, rtol=3e-3)


@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_varlen_gradients_match_recurrence():
    cu = torch.tensor([0, 1, 40, 90])
    q, k, v, g, beta = inputs(1, 90, 2, 4, 16, 16)
    args = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    o, _ = gdn.chunk_gated_delta_rule(*args, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    do = torch.randn_like(o)
    (o * do).sum().backward()
    ref = [t.double().clone().requires_grad_() for t in (q, k, v, g, beta)]
    (recurrence(*ref, l2norm=True, cu_seqlens=cu)[0] * do.double()).sum().backward()
    for a, r in zip(args, ref):
        assert rel_err(a.grad, r.grad) < 1e-3


@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_saved_states_give_the_recomputed_gradients():
    """save_states (the default) hands the forward's h and v_new to the backward; the recomputing
    path (save_states=False) gives the same gradients to fp32 rounding."""
    torch.manual_seed(4)
    cu = torch.tensor([0, 70, 71, 200])
    q, k, v, g, beta = inputs(1, 200, 2, 4, 16, 16)
    h0 = torch.randn(3, 4, 16, 16) * 0.1
    grads = []
    for save in (True, False):
        args = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, f = gdn.chunk_gated_delta_rule(*args[:5], initial_state=args[5], output_final_state=True, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True, save_states=save)
        torch.manual_seed(5)
        ((o * torch.randn_like(o)).sum() + (f * torch.randn_like(f)).sum()).backward()
        grads.append([a.grad for a in args])
    for a, b in zip(*grads):
        assert rel_err(a, b) < 1e-5


@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_plain_torch_baseline_agrees():
    """bench/gdn_torch_baseline.py times fwd+bwd against a plain-torch chunked form: that form must
    compute the same outputs and gradients as the op (grouped heads, l2norm, h0, T not a multiple of 64)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "gdn_torch_baseline.py"
    spec = importlib.util.spec_from_file_location("gdn_torch_baseline", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    torch.manual_seed(6)
    q, k, v, g, beta = inputs(1, 150, 2, 4, 16, 16)
    h0 = torch.randn(1, 4, 16, 16) * 0.1
    do, dht = torch.randn(1, 150, 4, 16), torch.randn(1, 4, 16, 16)
    grads = []
    for fn in (lambda *a: gdn.chunk_gated_delta_rule(*a[:5], initial_state=a[5], output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True),
               lambda *a: base.chunk_gdn(*a, 16 ** -0.5)):
        args = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, fin = fn(*args)
        ((o * do).sum() + (fin * dht).sum()).backward()
        grads.append([a.grad for a in args])
    for a, b in zip(*grads):
        assert rel_err(a, b) < 1e-4


# ---- the layer ---------------------------------------------------------------------------------

def make_layer(variant, dtype=torch.float32):
    torch.manual_seed(2)
    layer = gdn.GatedDeltaNet(64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, variant=variant)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        layer.norm.weight.add_(1.0)
    return layer.to(dtype)


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5"])
def test_layer_matches_hf_twin(variant):
    layer = make_layer(variant)
    x = torch.randn(2, 70, 64)
    with torch.no_grad():
        assert rel_err(layer(x), hf_gated_delta_net(layer, x)) < 1e-4


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5"])
def test_layer_loads_hf_keys_and_decodes(variant):
    src = make_layer(variant)
    keys = set(src.state_dict())
    want = {"conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"} | (
        {"in_proj_qkvz.weight", "in_proj_ba.weight"} if variant == "qwen3_next"
        else {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"})
    assert keys == want
    layer = gdn.GatedDeltaNet(64, 2, 4, 16, 16, variant=variant)
    layer.load_state_dict(src.state_dict())
    x = torch.randn(1, 12, 64)
    with torch.no_grad():
        full = hf_gated_delta_net(layer, x)
        cache = gdn.GatedDeltaNetCache()
        outs = [layer(x[:, :9], cache)] + [layer(x[:, t:t + 1], cache) for t in range(9, 12)]
    assert rel_err(torch.cat(outs, 1), full) < 1e-4


@pytest.mark.skipif(not ot.has_op("chunk_gated_delta_rule_bwd"), reason="operator not landed yet: chunk_gated_delta_rule_bwd")
def test_layer_backward_matches_hf_twin():
    layer = make_layer("qwen3_next")
    x = torch.randn(1, 30, 64)
    dy = torch.randn(1, 30, 64)
    (layer(x) * dy).sum().backward()
    got = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    twin = make_layer("qwen3_next").double()
    (hf_gated_delta_net(twin, x.double(), keep_grad=True) * dy.double()).sum().backward()
    for n, p in twin.named_parameters():
        assert rel_err(got[n], p.grad) < 1e-3, n


def test_layer_bf16():
    layer = make_layer("qwen3_5", torch.bfloat16)
    x = torch.randn(1, 40, 64).bfloat16()
    with torch.no_grad():
        assert rel_err(layer(x), hf_gated_delta_net(layer, x)) < 3e-2


@pytest.mark.skipif(not ot.has_op("gated_delta_net_decode"), reason="operator not landed yet: gated_delta_net_decode")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_decode_step_is_the_layer_op_by_op(monkeypatch, dtype):
    """On library Linears a decode step is one gated_delta_net_decode call (states updated in place):
    the outputs and states of the op-by-op path."""
    from ops_transformer.layers import use_library_linear
    layer = use_library_linear(make_layer("qwen3_5", dtype))
    x = torch.randn(2, 12, 64).to(dtype)
    calls = []
    fused_op = gdn._DECODE
    monkeypatch.setattr(gdn, "_DECODE", lambda *a: calls.append(1) or fused_op(*a))

    def run():
        cache = gdn.GatedDeltaNetCache()
        outs = [layer(x[:, :9], cache)] + [layer(x[:, t:t + 1], cache) for t in range(9, 12)]
        return torch.cat(outs, 1), cache

    with torch.no_grad():
        fused, cf = run()
        assert len(calls) == 3
        monkeypatch.setattr(gdn, "_DECODE", None)
        plain, cp = run()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_err(fused, plain) < tol
    assert rel_err(cf.recurrent_state, cp.recurrent_state) < 1e-6
    assert rel_err(cf.conv_state, cp.conv_state) < 1e-6
