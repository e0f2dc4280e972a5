"""Plain-PyTorch twins for the GDN tests: the token recurrence (spec section 3) in float64 and the
HF Qwen3-Next / Qwen3.5 GatedDeltaNet layer written the way transformers writes it."""
import torch
import torch.nn.functional as F


def l2n(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrence(q, k, v, g, beta, scale=None, initial_state=None, l2norm=False, cu_seqlens=None):
    """BTHD inputs; returns o [B, T, HV, DV] and final states [N, HV, DK, DV], float64."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    G = HV // HK
    if l2norm:
        q, k = l2n(q), l2n(k)
    scale = DK ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        seqs = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, DV, dtype=torch.float64)
    finals = []
    for n, (b, s, e) in enumerate(seqs):
        S = torch.zeros(HV, DK, DV, dtype=torch.float64) if initial_state is None else initial_state[n].double().clone()
        for t in range(s, e):
            kt, qt = k[b, t].repeat_interleave(G, 0), q[b, t].repeat_interleave(G, 0)
            S = S * g[b, t].exp()[:, None, None]
            delta = beta[b, t][:, None] * (v[b, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + torch.einsum("hk,hv->hkv", kt, delta)
            o[b, t] = scale * torch.einsum("hk,hkv->hv", qt, S)
        finals.append(S)
    return o, torch.stack(finals)


def hf_gated_delta_net(layer, x, keep_grad=False):
    """HF forward (prefill, no cache) of a GatedDeltaNet with `layer`'s parameters, plain PyTorch
    (keep_grad: differentiable w.r.t. the layer's parameters)."""
    p = dict(layer.named_parameters()) if keep_grad else {n: t.detach() for n, t in layer.state_dict().items()}
    B, T, _ = x.shape
    HK, HV, dk, dv = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    if layer.variant == "qwen3_next":
        qkvz = F.linear(x, p["in_proj_qkvz.weight"]).view(B, T, HK, -1)
        ba = F.linear(x, p["in_proj_ba.weight"]).view(B, T, HK, -1)
        q, k, v, z = torch.split(qkvz, [dk, dk, HV // HK * dv, HV // HK * dv], dim=3)
        b, a = torch.split(ba, [HV // HK, HV // HK], dim=3)
        v, z = v.reshape(B, T, -1, dv), z.reshape(B, T, -1, dv)
        b, a = b.reshape(B, T, HV), a.reshape(B, T, HV)
        mixed = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1)
    else:
        mixed = F.linear(x, p["in_proj_qkv.weight"])
        z = F.linear(x, p["in_proj_z.weight"]).reshape(B, T, -1, dv)
        b, a = F.linear(x, p["in_proj_b.weight"]), F.linear(x, p["in_proj_a.weight"])
    w = p["conv1d.weight"]
    mixed = F.silu(F.conv1d(mixed.transpose(1, 2), w, None, padding=w.shape[-1] - 1, groups=w.shape[0])[:, :, :T])
    mixed = mixed.transpose(1, 2)
    q, k, v = torch.split(mixed, [HK * dk, HK * dk, HV * dv], dim=-1)
    q, k, v = q.reshape(B, T, -1, dk), k.reshape(B, T, -1, dk), v.reshape(B, T, -1, dv)
    beta = b.sigmoid()
    g = -p["A_log"].float().exp() * F.softplus(a.float() + p["dt_bias"])
    o, _ = recurrence(q, k, v, g, beta, l2norm=True)
    o = o.to(x.dtype).reshape(-1, dv)  # recurrence is float64; x's dtype again as HF
    zz = z.reshape(-1, dv)
    var = o.float().pow(2).mean(-1, keepdim=True)
    h = o.float() * torch.rsqrt(var + layer.eps)
    h = (p["norm.weight"] * h.to(x.dtype)) * F.silu(zz.float())
    o = h.to(x.dtype).reshape(B, T, -1)
    return F.linear(o, p["out_proj.weight"])


def recurrence_seq(q, k, v, g, beta, scale, S, block=64):
    """One sequence, differentiable and memory-light: q, k [L, HK, DK], v [L, HV, DV], g, beta
    [L, HV], S [HV, DK, DV] (float64 tensors). Blocks of `block` tokens are checkpointed, so the
    backward keeps ~L/block states instead of one per token. Returns o [L, HV, DV] and the final S."""
    import torch.utils.checkpoint as cp
    G = v.shape[1] // q.shape[1]

    def run(S, q, k, v, g, beta):
        outs = []
        for t in range(q.shape[0]):
            kt, qt = k[t].repeat_interleave(G, 0), q[t].repeat_interleave(G, 0)
            S = S * g[t].exp()[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + torch.einsum("hk,hv->hkv", kt, delta)
            outs.append(scale * torch.einsum("hk,hkv->hv", qt, S))
        return torch.stack(outs) if outs else v[:0], S

    os = []
    for t0 in range(0, q.shape[0], block):
        sl = slice(t0, t0 + block)
        o, S = cp.checkpoint(run, S, q[sl], k[sl], v[sl], g[sl], beta[sl])
        os.append(o)
    return (torch.cat(os) if os else v[:0]), S
