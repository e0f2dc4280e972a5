"""Mixture of Experts: torch_npu-style functional ops on the library's CPU kernels, and modules.

Functional (same names and arguments as torch_npu.npu_moe_* without the npu_ prefix), e.g.
    y, expert_idx, row_idx = moe_gating_top_k_softmax(logits, k=2)
    expanded_x, expanded_row_idx, counts, scale = moe_init_routing_v2(x, expert_idx, active_num=T*K, expert_num=E)
    (out,) = grouped_matmul([expanded_x], [w], group_list=counts, group_list_type=1, split_item=2)
Index tensors are int32 (int64 ids are rejected with an error naming the argument).

Modules (forward only until the library's MoE backward lands; see HAS_BACKWARD):
    ExpertParallel(experts, top_k=2, capacity_factor=1.2, precision="bf16", gate=None)
    SparseMoeBlock(hidden_size, num_experts, intermediate_size, top_k, norm_topk_prob=True)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._lib import has_op, ops

__all__ = [
    "moe_gating_top_k_softmax", "moe_gating_top_k_softmax_v2", "moe_gating_top_k", "moe_init_routing",
    "moe_init_routing_v2", "moe_compute_expert_tokens", "moe_re_routing", "moe_token_permute", "moe_token_unpermute",
    "grouped_matmul", "moe_finalize_routing", "moe_finalize_routing_v2", "moe_final_optimizer_mm", "moe_aux_loss",
    "moe_z_loss", "moe_capacity", "moe_ffn", "PackedWeight", "MoeExperts", "ExpertParallel", "SparseMoeBlock",
    "HAS_BACKWARD",
]

HAS_BACKWARD = has_op("moe_ffn_backward")
HAS_GMM_BACKWARD = has_op("grouped_matmul_backward")


def _op(name):
    def call(*args, **kwargs):
        return getattr(ops, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = f"torch.ops.ops_transformer.{name} (torch_npu.npu_{name} semantics)."
    return call


for _name in __all__[:13]:
    globals()[_name] = _op(_name)


class _GroupedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, group_list, group_list_type, act_type):
        (y,) = ops.grouped_matmul([x], [weight], bias=None if bias is None else [bias], group_list=group_list,
                                  split_item=2, group_list_type=group_list_type, act_type=act_type)
        ctx.save_for_backward(x, weight, bias, group_list)
        ctx.args = (group_list_type, act_type)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, group_list = ctx.saved_tensors
        gl_type, act = ctx.args
        need = ctx.needs_input_grad
        dx, dw, db = ops.grouped_matmul_backward(
            dy.contiguous(), x, weight, group_list, group_list_type=gl_type, act_type=act, bias=bias,
            need_dx=need[0], need_dweight=need[1], need_dbias=bias is not None and need[2])
        return (dx, None if dw is None else dw.to(weight.dtype), None if db is None else db.to(bias.dtype),
                None, None, None)


def grouped_matmul(x, weight, *, bias=None, group_list=None, split_item=0, group_type=None, group_list_type=0,
                   act_type=0, output_dtype=None):
    """torch_npu.npu_grouped_matmul, M-split: y[rows of g] = act(x[rows of g] @ weight[g] + bias[g]).
    x = [x [M, K]]; weight = [W [G, K, N]] (or its transposed view of [G, N, K]) or G tensors [K, N];
    act_type 0 none, 1 relu, 2 gelu, 5 silu, 6 swiglu. Differentiable (x, weight, bias) when the
    library's grouped_matmul_backward is built and one x and one weight tensor are given."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in list(x) + list(weight) + list(bias or []))
    if needs_grad and HAS_GMM_BACKWARD and len(x) == 1 and len(weight) == 1 and (bias is None or len(bias) == 1):
        if group_type not in (None, 0) or output_dtype not in (None, x[0].dtype):
            raise RuntimeError("grouped_matmul: argument 'group_type'/'output_dtype': expected M-split in x's dtype")
        y = _GroupedMatmul.apply(x[0], weight[0], None if bias is None else bias[0], group_list, group_list_type,
                                 act_type)
        if split_item >= 2:
            return [y]
        return list(torch.split(y, _group_sizes(group_list, group_list_type)))
    return ops.grouped_matmul(x, weight, bias=bias, group_list=group_list, split_item=split_item,
                              group_type=group_type, group_list_type=group_list_type, act_type=act_type,
                              output_dtype=output_dtype)


def _group_sizes(group_list, group_list_type):
    gl = group_list.long()
    if group_list_type == 0:
        return torch.diff(gl, prepend=gl.new_zeros(1)).tolist()
    return (gl if group_list_type == 1 else gl[:, 1]).tolist()


def moe_aux_loss(probs, tokens_per_expert, k, coeff=1.0):
    """Switch/GShard load-balancing loss as a 0-d tensor; differentiable w.r.t. probs (closed form:
    d loss / d probs[t, i] = coeff * E / (K * T^2) * tokens_per_expert[i])."""
    return _AuxLoss.apply(probs, tokens_per_expert, k, coeff)


def moe_z_loss(logits, coeff=1.0, mask=None):
    """ST-MoE z-loss coeff * mean_t logsumexp(logits[t])^2 as a 0-d tensor, differentiable w.r.t. logits."""
    return _ZLoss.apply(logits, coeff, mask)


def moe_capacity(tokens, k, experts, capacity_factor, min_capacity=0):
    """Megatron get_capacity: ceil(T * K / E * capacity_factor), at least min_capacity."""
    return ops.moe_capacity(tokens, k, experts, capacity_factor, min_capacity)


class _AuxLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, probs, counts, k, coeff):
        ctx.save_for_backward(counts)
        ctx.args = (probs.shape, probs.dtype, k, coeff)
        return torch.tensor(ops.moe_aux_loss(probs, counts, k, coeff), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        (counts,) = ctx.saved_tensors
        (T, E), dtype, k, coeff = ctx.args
        g = grad * coeff * E / (k * T * T) * counts.float()
        return g.expand(T, E).to(dtype), None, None, None


class _ZLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, coeff, mask):
        ctx.save_for_backward(logits, mask)
        ctx.coeff = coeff
        return torch.tensor(ops.moe_z_loss(logits, coeff, mask), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        logits, mask = ctx.saved_tensors
        lf = logits.float()
        lse = torch.logsumexp(lf, -1, keepdim=True)
        w = torch.ones_like(lse) if mask is None else mask.reshape(-1, 1).float()
        n = w.sum().clamp_min(1)
        g = grad * ctx.coeff * 2 * lse * torch.softmax(lf, -1) * w / n
        return g.to(logits.dtype), None, None


# ---- prepacked weights and the fused layer ---------------------------------------------------

def PackedWeight(weight, layout="torch"):
    """A matrix packed once for the engine ("torch": nn.Linear weight [N, K]; "KN": [K, N])."""
    return torch.classes.ops_transformer.PackedWeight(weight, layout)


def MoeExperts(gate, up, down, layout="torch"):
    """Prepacked experts. "torch": gate/up [E, I, H], down [E, H, I] (stacked nn.Linear weights);
    "EHI": gate/up [E, H, I], down [E, I, H]; up=None: gate is the fused [gate | up] tensor.
    Methods: set_expert(e, gate, up, down, layout) replaces (e < E) or appends (e == E) one expert
    without repacking the others; remove_expert(e); num_experts(); packed_bytes()."""
    return torch.classes.ops_transformer.MoeExperts(gate, up, down, layout)


def moe_ffn(x, router, experts, k=2, **kwargs):
    """The whole MoE layer forward on prepacked weights: router -> top-k -> grouped SwiGLU FFN ->
    weighted combine. x [T, H]; router a PackedWeight of the [E, H] gate; experts a MoeExperts.
    Returns (y, router_logits, topk_ids, topk_weights, expert_counts, dropped)."""
    return ops.moe_ffn(x, router, experts, k=k, **kwargs)


_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


def _expert_weights(expert):
    """(gate, up, down) nn.Linear weights of one FFN expert: Qwen/Llama names or Mixtral's w1/w3/w2."""
    for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        if all(hasattr(expert, n) for n in names):
            return tuple(getattr(expert, n).weight for n in names)
    raise TypeError(f"expert {type(expert).__name__} has neither gate_proj/up_proj/down_proj nor w1/w3/w2 Linear layers")


class _RouterCache:
    """Packs the router weight again only when it changed (training steps, load_state_dict)."""

    def __init__(self):
        self.key, self.packed = None, None

    def get(self, weight, dtype):
        key = (weight.data_ptr(), weight._version, dtype)
        if key != self.key:
            self.packed = PackedWeight(weight.detach().to(dtype).contiguous())
            self.key = key
        return self.packed


class ExpertParallel(nn.Module):
    """Runs a list of FFN experts as one fused MoE layer on prepacked weights.

    experts: nn.Modules with gate_proj/up_proj/down_proj (Qwen3-MoE, Llama) or w1/w3/w2 (Mixtral)
    Linear layers, all of the same shape; packed once (call repack() after changing them).
    gate: the router Linear(H, E, bias=False) (created when None). forward(x [..., H]) -> y [..., H].
    After each call: aux_loss (Switch load-balancing loss of that call, a 0-d tensor),
    expert_counts [E] and dropped (pairs over capacity). capacity_factor=None is dropless."""

    def __init__(self, experts, top_k=2, capacity_factor=1.2, precision="bf16", gate=None, norm_topk_prob=False):
        super().__init__()
        experts = list(experts)
        if not experts:
            raise ValueError("ExpertParallel: experts must not be empty")
        if precision not in _DTYPES:
            raise ValueError(f"ExpertParallel: precision must be one of {sorted(_DTYPES)}, got {precision!r}")
        self.experts = nn.ModuleList(experts)
        gw, _, _ = _expert_weights(experts[0])
        self.hidden_size = gw.shape[1]
        self.gate = gate if gate is not None else nn.Linear(self.hidden_size, len(experts), bias=False)
        self.top_k, self.capacity_factor, self.norm_topk_prob = top_k, capacity_factor, norm_topk_prob
        self.dtype = _DTYPES[precision]
        self._router = _RouterCache()
        self.aux_loss = self.expert_counts = None
        self.dropped = 0
        self.repack()

    @torch.no_grad()
    def repack(self):
        """Packs every expert again (after their weights changed)."""
        g, u, d = zip(*(_expert_weights(e) for e in self.experts))
        st = lambda ws: torch.stack([w.detach().to(self.dtype) for w in ws])
        self._packed = MoeExperts(st(g), st(u), st(d), "torch")

    @torch.no_grad()
    def set_expert(self, i, expert):
        """Replaces expert i (or appends when i == number of experts) and packs only that one."""
        g, u, d = (w.detach().to(self.dtype) for w in _expert_weights(expert))
        self._packed.set_expert(i, g, u, d, "torch")
        if i == len(self.experts):
            self.experts.append(expert)
        else:
            self.experts[i] = expert

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad and not HAS_BACKWARD:
            raise NotImplementedError("ExpertParallel: the MoE backward is not built into this library yet")
        shape = x.shape
        xt = x.reshape(-1, self.hidden_size).to(self.dtype)
        E = len(self.experts)
        cf = self.capacity_factor or 0.0
        y, logits, ids, _, counts, dropped = ops.moe_ffn(
            xt, self._router.get(self.gate.weight, self.dtype), self._packed, k=self.top_k,
            norm_topk_prob=self.norm_topk_prob, capacity_factor=float(cf))
        probs = torch.softmax(logits, -1)
        self.expert_counts, self.dropped = counts, dropped
        self.aux_loss = moe_aux_loss(probs, counts, self.top_k) if xt.shape[0] else torch.zeros(())
        self.router_logits = logits
        return y.to(x.dtype).reshape(shape)


class _MLP(nn.Module):
    def __init__(self, hidden, inter, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """The HF Qwen3-MoE sparse MoE block (Qwen3MoeSparseMoeBlock) on the fused kernel. Parameters
    have HF's names (gate.weight, experts.{i}.gate_proj.weight, ...), so load_state_dict takes the
    HF block's keys as they are; from_mixtral_state_dict takes Mixtral's (w1/w3/w2).
    forward(x [B, T, H] or [T, H]) -> (y, router_logits [B*T, E]) as HF. Weights are packed lazily
    at the first call after construction or load_state_dict; call repack() after editing them."""

    def __init__(self, hidden_size, num_experts, intermediate_size, top_k, norm_topk_prob=True, dtype=None):
        super().__init__()
        self.hidden_size, self.num_experts, self.intermediate_size = hidden_size, num_experts, intermediate_size
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False, dtype=dtype)
        self.experts = nn.ModuleList(_MLP(hidden_size, intermediate_size, dtype) for _ in range(num_experts))
        self._packed = None
        self._router = _RouterCache()
        self._register_load_state_dict_pre_hook(lambda *a, **k: self.repack(lazy=True))

    @torch.no_grad()
    def repack(self, lazy=False):
        if lazy:
            self._packed = None
            return
        st = lambda name: torch.stack([getattr(e, name).weight.detach() for e in self.experts])
        self._packed = MoeExperts(st("gate_proj"), st("up_proj"), st("down_proj"), "torch")

    @classmethod
    def from_mixtral_state_dict(cls, state_dict, top_k=2, norm_topk_prob=True, prefix=""):
        """Builds a block from a Mixtral MoE block's state_dict (gate.weight, experts.{i}.w1/w2/w3.weight)."""
        gate = state_dict[prefix + "gate.weight"]
        E, H = gate.shape
        inter = state_dict[prefix + "experts.0.w1.weight"].shape[0]
        block = cls(H, E, inter, top_k, norm_topk_prob, dtype=gate.dtype)
        names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        sd = {"gate.weight": gate}
        for i in range(E):
            for src, dst in names.items():
                sd[f"experts.{i}.{dst}.weight"] = state_dict[f"{prefix}experts.{i}.{src}.weight"]
        block.load_state_dict(sd)
        return block

    def forward(self, hidden_states):
        if torch.is_grad_enabled() and hidden_states.requires_grad and not HAS_BACKWARD:
            raise NotImplementedError("SparseMoeBlock: the MoE backward is not built into this library yet")
        if self._packed is None:
            self.repack()
        shape = hidden_states.shape
        dtype = self.gate.weight.dtype
        x = hidden_states.reshape(-1, self.hidden_size).to(dtype)
        y, logits, *_ = ops.moe_ffn(x, self._router.get(self.gate.weight, dtype), self._packed, k=self.top_k,
                                    norm_topk_prob=self.norm_topk_prob)
        return y.to(hidden_states.dtype).reshape(shape), logits.to(dtype)
