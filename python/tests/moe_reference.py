"""Plain-PyTorch twins for the MoE tests: the HF-style loop over experts and per-op references
written from specs/moe_ops.md."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def expert_ffn(h, g, u, d):
    """SwiGLU expert with nn.Linear weights: g, u [I, H], d [H, I]."""
    return (F.silu(h @ g.t()) * (h @ u.t())) @ d.t()


def hf_moe(x, gate_w, gates, ups, downs, top_k, norm_topk_prob, capacity=None):
    """Qwen3MoeSparseMoeBlock.forward in float64: softmax router, top-k, optional renorm, loop over
    experts. capacity: keep only the first `capacity` (token, k) pairs per expert in token order."""
    x, gate_w = x.double(), gate_w.double()
    logits = x @ gate_w.t()
    probs = torch.softmax(logits, -1)
    w, ids = torch.topk(probs, top_k, -1)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    counts = torch.zeros(gate_w.shape[0], dtype=torch.int64)
    for e in range(gate_w.shape[0]):
        tok, slot = torch.where(ids == e)
        counts[e] = tok.numel()
        if capacity is not None:
            tok, slot = tok[:capacity], slot[:capacity]
        if tok.numel():
            out = expert_ffn(x[tok], gates[e].double(), ups[e].double(), downs[e].double())
            y.index_add_(0, tok, out * w[tok, slot, None])
    return y, logits, ids, w, counts


def stable_sort_ids(expert_idx):
    """Stable sort of the token-major flattened ids: (sorted ids, perm)."""
    flat = expert_idx.reshape(-1).long()
    perm = torch.sort(flat, stable=True).indices
    return flat[perm], perm


# Expert modules as the HF checkpoints name their Linear layers (Qwen3-MoE and Mixtral).
class QwenExpert(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)


class MixtralExpert(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False)
