"""A small Qwen3.5-style byte-level hybrid LM on the library's layers, and its plain-PyTorch twin.

    cfg = HybridConfig(hidden_size=64, num_layers=4)
    model = HybridLM(cfg)                    # GatedDeltaNet + SparseMoeBlock on the library's kernels
    twin = HybridLM(cfg, impl="torch")       # the same model in plain torch (hybrid_torch.py)
    twin.load_state_dict(model.state_dict())
    logits, aux = model(ids [B, T])                           # training / prefill
    cache = model.new_cache(); model(prompt, cache=cache); model(next_ids [B, 1], cache=cache)

Layer i is [pre-RMSNorm -> token mixer -> residual, pre-RMSNorm -> SparseMoeBlock -> residual]; the
mixer is full causal attention with RoPE on every `full_attention_interval`-th layer (3, 7, ... as in
Qwen3-Next / Qwen3.5) and a GatedDeltaNet (Qwen3.5 projections) elsewhere. One class for both
implementations, so the parameter names are one set. Attention is written once here: plain torch
for the twin, RoPE (`rotary_mul`) and the fused `causal_attention` for impl="ot"; the GDN layer, the MoE block, the norms (the
library's add_rms_norm: each residual add fused into the norm that follows it, as vLLM passes the
residual) and the projections (the library's matmul, ops_transformer.layers.Linear) differ."""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["HybridConfig", "HybridLM", "HybridCache", "RMSNorm", "Attention", "moe_aux_loss"]


@dataclass
class HybridConfig:
    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    head_dim: int = 32
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    conv_kernel_size: int = 4
    num_experts: int = 8
    moe_intermediate_size: int = 128
    top_k: int = 2
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    def is_attention(self, i):
        return (i + 1) % self.full_attention_interval == 0

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps), statistics in fp32 (the plain-torch twin's; the library
    model runs ops_transformer.layers.RMSNorm). forward(x, residual) = (norm(x + residual), x + residual)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, residual=None):
        if residual is not None:
            x = x + residual
            return self(x), x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _norm_class(impl):
    if impl == "ot":
        from ..layers import RMSNorm as LibraryRMSNorm
        return LibraryRMSNorm
    return RMSNorm


def _rope(x, pos, theta):
    """Rotary embedding (rotate-half form) of x [B, H, T, D] at positions pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _append_kv(cache, k, v, past):
    """Writes the new keys / values at positions past.. of the cache's buffers (grown by doubling)
    and returns views of all positions so far; cache["k"] / cache["v"] are those views. A step
    copies only its own rows (a torch.cat of the whole cache each step was a quarter of a decode
    token's time at a thousand positions)."""
    B, H, T, D = k.shape
    n = past + T
    buf = cache.get("_kv")
    if buf is None or buf[0].shape[2] < n:
        cap = max(n, 64, 2 * (buf[0].shape[2] if buf is not None else 0))
        grown = tuple(torch.empty(B, H, cap, D, dtype=k.dtype) for _ in range(2))
        if past:
            grown[0][:, :, :past], grown[1][:, :, :past] = cache["k"], cache["v"]
        buf = cache["_kv"] = grown
    buf[0][:, :, past:n], buf[1][:, :, past:n] = k, v
    cache["k"], cache["v"] = buf[0][:, :, :n], buf[1][:, :, :n]
    return cache["k"], cache["v"]


class Attention(nn.Module):
    """Causal multi-head attention with RoPE; cache is a dict holding 'k', 'v' [B, H, S, D] (KV cache)."""

    def __init__(self, cfg, impl="torch"):
        super().__init__()
        H, D = cfg.num_attention_heads, cfg.head_dim
        if impl == "ot":  # RoPE and the fused causal attention on the library (the twin: _rope, torch ops)
            from ..layers import causal_attention, rotary_mul
            self._attention, self._rotary = causal_attention, rotary_mul
        else:
            self._attention, self._rotary = None, None
        self._tables = None  # (cos, sin) [positions, D] fp32 for the library's rotary_mul, grown by doubling
        self.heads, self.head_dim, self.theta = H, D, cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden_size, H * D, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, H * D, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, H * D, bias=False)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=False)

    def _rope_tables(self, past, T, dtype):
        """cos, sin [T, D] at positions past.. (the values _rope computes: the same formula per position)."""
        n = past + T
        if self._tables is None or self._tables[0].shape[0] < n:
            cap = max(n, 256, 2 * (self._tables[0].shape[0] if self._tables is not None else 0))
            d = self.head_dim
            inv = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
            ang = torch.arange(cap).float()[:, None] * inv[None, :]
            self._tables = (torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1))
        cos, sin = self._tables
        return cos[past:n].to(dtype), sin[past:n].to(dtype)

    def forward(self, x, cache=None):
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        past = 0 if cache is None or "k" not in cache else cache["k"].shape[2]
        if self._rotary is not None:
            cos, sin = self._rope_tables(past, T, q.dtype)
            q, k = self._rotary(q, cos, sin), self._rotary(k, cos, sin)
        else:
            pos = torch.arange(past, past + T)
            q, k = _rope(q, pos, self.theta), _rope(k, pos, self.theta)
        if cache is not None:
            k, v = _append_kv(cache, k, v, past)
        if self._attention is not None:
            o = self._attention(q, k, v, 1.0 / math.sqrt(self.head_dim))
        else:
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if T > 1:  # query t (absolute past + t) sees keys 0..past + t
                mask = torch.ones(T, past + T, dtype=torch.bool).triu(past + 1)
                s = s.masked_fill(mask, float("-inf"))
            o = torch.matmul(torch.softmax(s.float(), -1).to(v.dtype), v)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


def moe_aux_loss(router_logits, top_k):
    """Switch load-balancing loss E * sum_e f_e P_e from one layer's router logits [N, E] (f_e: the
    fraction of top-k picks of expert e, no gradient; P_e: the mean router probability)."""
    E = router_logits.shape[-1]
    probs = torch.softmax(router_logits.float(), -1)
    ids = probs.topk(top_k, -1).indices
    f = torch.zeros(E).scatter_add_(0, ids.reshape(-1), torch.ones(ids.numel())) / max(ids.numel(), 1)
    return E * (f * probs.mean(0)).sum()


class _Layer(nn.Module):
    def __init__(self, cfg, i, impl):
        super().__init__()
        norm = _norm_class(impl)
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_attention = cfg.is_attention(i)
        if impl == "ot":
            from ..gdn import GatedDeltaNet
            from ..moe import SparseMoeBlock
        else:
            from .hybrid_torch import GatedDeltaNet, SparseMoeBlock
        if self.is_attention:
            self.self_attn = Attention(cfg, impl)
        else:
            self.linear_attn = GatedDeltaNet(
                cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                cfg.linear_value_head_dim, cfg.conv_kernel_size, cfg.rms_norm_eps, variant="qwen3_5")
        self.mlp = SparseMoeBlock(cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.top_k,
                                  cfg.norm_topk_prob)

    def forward(self, x, pending, cache):
        """x: the residual stream, pending: the previous layer's MoE output not yet added to it (None
        at the first layer). Returns (stream, this layer's MoE output, router logits)."""
        if pending is None:
            n = self.input_layernorm(x)
        else:
            n, x = self.input_layernorm(pending, x)
        h = self.self_attn(n, cache) if self.is_attention else self.linear_attn(n, cache)
        n, x = self.post_attention_layernorm(h, x)
        h, logits = self.mlp(n)
        return x, h, logits


class HybridCache:
    """Decode state of every layer: a KV dict for attention layers, the GDN layer's own cache
    (conv state + recurrent state) elsewhere."""

    def __init__(self, layers):
        self.layers = layers


class HybridLM(nn.Module):
    """impl="ot": the library's GatedDeltaNet and SparseMoeBlock; impl="torch": the plain-torch twins."""

    def __init__(self, cfg, impl="ot"):
        super().__init__()
        if impl not in ("ot", "torch"):
            raise ValueError(f"HybridLM: impl must be 'ot' or 'torch', got {impl!r}")
        self.cfg, self.impl = cfg, impl
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(_Layer(cfg, i, impl) for i in range(cfg.num_layers))
        self.norm = _norm_class(impl)(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if impl == "ot":  # every projection on the library's matrix engine (the MoE experts run fused)
            from ..layers import use_library_linear
            use_library_linear(self)

    @torch.no_grad()
    def init_weights(self, seed):
        """Deterministic initialisation: normal(0, initializer_range) for embeddings and projections
        (HF's default), the GDN layers' own A_log / dt_bias / conv init kept, norms at one."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias") or name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            elif "conv1d" in name:
                bound = 1 / math.sqrt(p.shape[-1])
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=gen))
            else:
                p.copy_(torch.empty(p.shape).normal_(0, self.cfg.initializer_range, generator=gen))
        return self

    def optimizer(self, lr, betas=(0.9, 0.999), weight_decay=1e-2):
        """AdamW over the parameters: the library's one-call step (ops_transformer.optim) for
        impl="ot", torch.optim.AdamW for the twin (the same update)."""
        if self.impl == "ot":
            from ..optim import AdamW
        else:
            AdamW = torch.optim.AdamW
        return AdamW(self.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)

    def clip_grad_norm_(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ (the library's one-call norm for impl="ot")."""
        if self.impl == "ot":
            from ..optim import clip_grad_norm_
        else:
            clip_grad_norm_ = torch.nn.utils.clip_grad_norm_
        return clip_grad_norm_(self.parameters(), max_norm)

    def new_cache(self):
        if self.impl == "ot":
            from ..gdn import GatedDeltaNetCache
        else:
            from .hybrid_torch import GatedDeltaNetCache
        return HybridCache([{} if l.is_attention else GatedDeltaNetCache() for l in self.layers])

    def forward(self, input_ids, cache=None):
        """input_ids [B, T] int64 -> (logits [B, T, vocab], aux: mean Switch loss over layers)."""
        x = self.embed_tokens(input_ids)
        aux, pending = [], None
        for i, layer in enumerate(self.layers):
            x, pending, logits = layer(x, pending, None if cache is None else cache.layers[i])
            if cache is None:
                aux.append(moe_aux_loss(logits, self.cfg.top_k))
        logits = self.lm_head(self.norm(x) if pending is None else self.norm(pending, x)[0])
        return logits, (torch.stack(aux).mean() if aux else torch.zeros(()))
