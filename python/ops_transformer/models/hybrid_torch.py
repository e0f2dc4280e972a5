"""The plain-PyTorch twins of the hybrid model's library layers, written the way HF transformers
writes them (Qwen3.5 GatedDeltaNet with torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule,
torch conv1d, Qwen3NextRMSNormGated; Qwen3MoeSparseMoeBlock's loop over experts). Same constructor
arguments and parameter names as ops_transformer.gdn.GatedDeltaNet / ops_transformer.moe.SparseMoeBlock."""
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GatedDeltaNet", "GatedDeltaNetCache", "SparseMoeBlock", "torch_chunk_gated_delta_rule",
           "torch_recurrent_gated_delta_rule"]


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=False):
    """HF's chunked gated delta rule (l2norm on q, k inside). q, k [B, T, H, DK] (already repeated
    to the value heads), v [B, T, H, DV], g, beta [B, T, H]. Returns o [B, T, H, DV], final [B, H, DK, DV]."""
    dtype = q.dtype
    q, k = l2norm(q), l2norm(k)
    q, k, v, beta, g = (x.transpose(1, 2).contiguous().float() for x in (q, k, v, beta, g))
    B, H, T, DK = k.shape
    DV = v.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    n = (T + pad) // chunk_size
    q = q * DK ** -0.5
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, v, k_beta, v_beta = (x.reshape(B, H, n, chunk_size, x.shape[-1]) for x in (q, k, v, k_beta, v_beta))
    g = g.reshape(B, H, n, chunk_size).cumsum(-1)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=0)
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().tril()
    attn = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        row, sub = attn[..., i, :i].clone(), attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(chunk_size)
    v = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp().unsqueeze(-1))
    S = torch.zeros(B, H, DK, DV) if initial_state is None else initial_state.float()
    out = []
    strict = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=1)
    for i in range(n):
        q_i, k_i, v_i = q[:, :, i], k[:, :, i], v[:, :, i]
        a = (q_i @ k_i.transpose(-1, -2) * decay[:, :, i]).masked_fill(strict, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ S
        out.append((q_i * g[:, :, i, :, None].exp()) @ S + a @ v_new)
        S = S * g[:, :, i, -1, None, None].exp() + (k_i * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(out, 2).reshape(B, H, -1, DV)[:, :, :T]
    return o.transpose(1, 2).contiguous().to(dtype), (S if output_final_state else None)


def torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state):
    """HF's token recurrence (decode): same shapes as the chunked form; returns (o, final state)."""
    dtype = q.dtype
    q, k = l2norm(q), l2norm(k)
    q, k, v, beta, g = (x.transpose(1, 2).contiguous().float() for x in (q, k, v, beta, g))
    B, H, T, DK = k.shape
    q = q * DK ** -0.5
    S = torch.zeros(B, H, DK, v.shape[-1]) if initial_state is None else initial_state.float()
    out = torch.zeros_like(v)
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        kv_mem = (S * k[:, :, t, :, None]).sum(-2)
        delta = (v[:, :, t] - kv_mem) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (S * q[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).contiguous().to(dtype), S


class GatedDeltaNetCache:
    def __init__(self):
        self.conv_state = None      # [B, conv_dim, K] (HF keeps the last K inputs)
        self.recurrent_state = None

    @property
    def empty(self):
        return self.recurrent_state is None


class _RMSNormGated(nn.Module):
    """HF Qwen3NextRMSNormGated."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """HF Qwen3_5GatedDeltaNet (torch fallback path); only variant="qwen3_5"."""

    def __init__(self, hidden_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size=4,
                 rms_norm_eps=1e-6, variant="qwen3_5"):
        super().__init__()
        if variant != "qwen3_5":
            raise ValueError("hybrid_torch.GatedDeltaNet: only variant='qwen3_5'")
        self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = num_k_heads, num_v_heads, head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkv = nn.Linear(hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel_size, groups=self.conv_dim,
                                padding=conv_kernel_size - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.norm = _RMSNormGated(head_v_dim, rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _conv(self, mixed, cache):
        """mixed [B, T, C] -> silu(causal depthwise conv) [B, T, C]; keeps the last K inputs in the cache."""
        T = mixed.shape[1]
        x = mixed.transpose(1, 2)
        K = self.conv1d.weight.shape[-1]
        if cache is not None and not cache.empty:  # HF torch_causal_conv1d_update
            state = torch.cat([cache.conv_state, x], -1)
            cache.conv_state = state[:, :, -K:]
            y = F.conv1d(state, self.conv1d.weight, None, groups=self.conv_dim)[:, :, -T:]
        else:
            if cache is not None:
                cache.conv_state = F.pad(x, (K - x.shape[-1], 0))[:, :, -K:]
            y = self.conv1d(x)[:, :, :T]
        return F.silu(y).transpose(1, 2)

    def forward(self, x, cache=None):
        B, T, _ = x.shape
        HK, HV, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        decode = cache is not None and not cache.empty
        mixed = self._conv(self.in_proj_qkv(x), cache)
        z = self.in_proj_z(x).reshape(B, T, HV, dv)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k, v = q.reshape(B, T, HK, dk), k.reshape(B, T, HK, dk), v.reshape(B, T, HV, dv)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        if HV > HK:
            q, k = q.repeat_interleave(HV // HK, dim=2), k.repeat_interleave(HV // HK, dim=2)
        if decode:
            o, state = torch_recurrent_gated_delta_rule(q, k, v, g, beta, cache.recurrent_state)
        else:
            o, state = torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=cache is not None)
        if cache is not None:
            cache.recurrent_state = state
        o = self.norm(o.reshape(-1, dv), z.reshape(-1, dv))
        return self.out_proj(o.reshape(B, T, -1))


class _MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """HF Qwen3MoeSparseMoeBlock: softmax router, top-k (renormalised), a loop over the experts."""

    def __init__(self, hidden_size, num_experts, intermediate_size, top_k, norm_topk_prob=True):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(_MLP(hidden_size, intermediate_size) for _ in range(num_experts))

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router_logits = self.gate(x)
        w = F.softmax(router_logits, dim=1, dtype=torch.float)
        w, selected = torch.topk(w, self.top_k, dim=-1)
        if self.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        w = w.to(x.dtype)
        y = torch.zeros_like(x)
        mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            slot, tok = torch.where(mask[e])
            if tok.numel():
                y = y.index_add(0, tok, self.experts[e](x[tok]) * w[tok, slot, None])
        return y.reshape(shape), router_logits
