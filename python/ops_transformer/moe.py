"""Mixture of Experts: torch_npu-style functional ops on the library's CPU kernels, and modules.

Functional (same names and arguments as torch_npu.npu_moe_* without the npu_ prefix), e.g.
    y, expert_idx, row_idx = moe_gating_top_k_softmax(logits, k=2)
    expanded_x, expanded_row_idx, counts, scale = moe_init_routing_v2(x, expert_idx, active_num=T*K, expert_num=E)
    (out,) = grouped_matmul([expanded_x], [w], group_list=counts, group_list_type=1, split_item=2)
Index tensors are int32 (int64 ids are rejected with an error naming the argument).

Autograd: the routers (y w.r.t. x), init routing v1/v2 and token permute (expanded rows w.r.t. x),
token unpermute and finalize routing (rows, probs/scales, skips, bias), grouped_matmul, the losses and
moe_ffn (given plain weight tensors instead of packed ones) are differentiable through the library's
backward operators (include/ot/moe_bwd.h, torch.ops.ops_transformer.<op>_backward).

Modules (trainable when HAS_BACKWARD):
    ExpertParallel(experts, top_k=2, capacity_factor=1.2, precision="bf16", gate=None)
    SparseMoeBlock(hidden_size, num_experts, intermediate_size, top_k, norm_topk_prob=True)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._lib import fast_op, has_op, ops

__all__ = [
    "moe_gating_top_k_softmax", "moe_gating_top_k_softmax_v2", "moe_gating_top_k", "moe_init_routing",
    "moe_init_routing_v2", "moe_compute_expert_tokens", "moe_re_routing", "moe_token_permute", "moe_token_unpermute",
    "grouped_matmul", "moe_finalize_routing", "moe_finalize_routing_v2", "moe_final_optimizer_mm", "moe_aux_loss",
    "moe_z_loss", "moe_capacity", "quantize_weights", "dequantize_weights", "moe_ffn", "PackedWeight", "MoeExperts", "ExpertParallel", "SparseMoeBlock",
    "HAS_BACKWARD",
]

HAS_BACKWARD = has_op("moe_ffn_backward")
_MOE_FFN = fast_op("moe_ffn")
HAS_GMM_BACKWARD = has_op("grouped_matmul_backward")


def _op(name):
    def call(*args, **kwargs):
        return getattr(ops, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = f"torch.ops.ops_transformer.{name} (torch_npu.npu_{name} semantics)."
    return call


for _name in __all__[:13]:
    globals()[_name] = _op(_name)


def _needs_grad(*tensors):
    return HAS_BACKWARD and torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _grad_as(g, t):
    """A gradient in the dtype of the tensor it belongs to (the library returns fp32 for weights)."""
    return None if g is None or t is None else g.to(t.dtype).reshape(t.shape)


# ---- routers: gradient to the selected scores only ------------------------------------------------

class _TopKSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, finished, k, allowed, renorm, v2, output_softmax):
        if v2:
            y, idx, sm = ops.moe_gating_top_k_softmax_v2(x, k=k, finished=finished, renorm=renorm,
                                                         output_softmax=output_softmax, allowed=allowed)
            extra = sm
        else:
            y, idx, extra = ops.moe_gating_top_k_softmax(x, finished, k, allowed=allowed)
        ctx.save_for_backward(x, idx, allowed)
        ctx.args = (renorm, v2)
        ctx.mark_non_differentiable(*(t for t in (idx, extra) if t is not None))
        return y, idx, extra

    @staticmethod
    def backward(ctx, dy, *_):
        x, idx, allowed = ctx.saved_tensors
        renorm, v2 = ctx.args
        E = x.shape[-1]
        args = (dy.reshape(-1, idx.shape[-1]).float().contiguous(), x.reshape(-1, E), idx.reshape(-1, idx.shape[-1]))
        al = None if allowed is None else allowed.reshape(-1, E)
        dx = (ops.moe_gating_top_k_softmax_v2_backward(*args, renorm, al) if v2
              else ops.moe_gating_top_k_softmax_backward(*args, al))
        return _grad_as(dx, x), None, None, None, None, None, None


def moe_gating_top_k_softmax(x, finished=None, k=1, *, allowed=None):
    """torch_npu.npu_moe_gating_top_k_softmax: (y, expert_idx, row_idx); y differentiable w.r.t. x."""
    if _needs_grad(x):
        return _TopKSoftmax.apply(x, finished, k, allowed, 0, False, False)
    return ops.moe_gating_top_k_softmax(x, finished, k, allowed=allowed)


def moe_gating_top_k_softmax_v2(x, *, k=1, finished=None, renorm=0, output_softmax=False, allowed=None):
    """torch_npu.npu_moe_gating_top_k_softmax_v2: (y, expert_idx, softmax_result); y differentiable."""
    if _needs_grad(x):
        return _TopKSoftmax.apply(x, finished, k, allowed, renorm, True, output_softmax)
    return ops.moe_gating_top_k_softmax_v2(x, k=k, finished=finished, renorm=renorm, output_softmax=output_softmax,
                                           allowed=allowed)


class _GatingTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k, kw):
        y, idx, scores = ops.moe_gating_top_k(x, k, **kw)  # out_flag forced: the backward needs the scores
        ctx.save_for_backward(x, idx, scores)
        ctx.kw = kw
        ctx.mark_non_differentiable(idx, scores)
        return y, idx, scores

    @staticmethod
    def backward(ctx, dy, *_):
        x, idx, scores = ctx.saved_tensors
        kw = ctx.kw
        dx = ops.moe_gating_top_k_backward(dy.float().contiguous(), scores, idx, kw["renorm"], kw["norm_type"],
                                           kw["routed_scaling_factor"], kw["eps"])
        return _grad_as(dx, x), None, None


def moe_gating_top_k(x, k, *, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                     out_flag=False, routed_scaling_factor=1.0, eps=1e-20, allowed=None):
    """torch_npu.npu_moe_gating_top_k: (y, expert_idx, out); y differentiable w.r.t. x."""
    kw = dict(bias=bias, k_group=k_group, group_count=group_count, group_select_mode=group_select_mode, renorm=renorm,
              norm_type=norm_type, routed_scaling_factor=routed_scaling_factor, eps=eps, allowed=allowed)
    if _needs_grad(x):
        y, idx, scores = _GatingTopK.apply(x, k, dict(kw, out_flag=True))
        return y, idx, scores if out_flag else None
    return ops.moe_gating_top_k(x, k, out_flag=out_flag, **kw)


# ---- routing: expanded rows w.r.t. x, unpermute and finalize -----------------------------------------

class _InitRouting(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, v2, args, kw):
        out = ops.moe_init_routing_v2(x, *args, **kw) if v2 else ops.moe_init_routing(x, *args)
        ids = args[0] if v2 else args[1]
        ctx.save_for_backward(out[1])
        ctx.args = (v2, x.shape, ids.shape[-1], kw.get("row_idx_type", 0))
        ctx.mark_non_differentiable(*(t for t in out[1:] if t is not None))
        return out

    @staticmethod
    def backward(ctx, dex, *_):
        (erow,) = ctx.saved_tensors
        v2, shape, K, row_type = ctx.args
        N = shape[0]
        dex = dex.contiguous()
        dx = (ops.moe_init_routing_v2_backward(dex, erow, N, K, row_type) if v2
              else ops.moe_init_routing_backward(dex, erow, N, K))
        return dx.reshape(shape), None, None, None


def moe_init_routing(x, row_idx, expert_idx, active_num):
    """torch_npu.npu_moe_init_routing: (expanded_x, expanded_row_idx, expanded_expert_idx); expanded_x
    differentiable w.r.t. x."""
    if _needs_grad(x):
        return _InitRouting.apply(x, False, (row_idx, expert_idx, active_num), {})
    return ops.moe_init_routing(x, row_idx, expert_idx, active_num)


def moe_init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1, expert_capacity=-1, expert_num=-1,
                        drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                        active_expert_range=(), row_idx_type=0, x_dtype=None):
    """torch_npu.npu_moe_init_routing_v2: (expanded_x, expanded_row_idx, expert_token_cumsum_or_count,
    expanded_scale); expanded_x differentiable w.r.t. x (not when quantised)."""
    kw = dict(scale=scale, offset=offset, active_num=active_num, expert_capacity=expert_capacity, expert_num=expert_num,
              drop_pad_mode=drop_pad_mode, expert_tokens_num_type=expert_tokens_num_type,
              expert_tokens_num_flag=expert_tokens_num_flag, quant_mode=quant_mode,
              active_expert_range=list(active_expert_range), row_idx_type=row_idx_type, x_dtype=x_dtype)
    if quant_mode < 0 and _needs_grad(x):
        return _InitRouting.apply(x, True, (expert_idx,), kw)
    return ops.moe_init_routing_v2(x, expert_idx, **kw)


class _TokenPermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, indices, num_out_tokens, padded_mode):
        out, sidx = ops.moe_token_permute(tokens, indices, num_out_tokens, padded_mode)
        ctx.save_for_backward(sidx)
        ctx.topk = indices.shape[-1] if indices.dim() > 1 else 1
        ctx.mark_non_differentiable(sidx)
        return out, sidx

    @staticmethod
    def backward(ctx, d_out, _):
        (sidx,) = ctx.saved_tensors
        return ops.moe_token_permute_backward(d_out.contiguous(), sidx, ctx.topk), None, None, None


def moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """torch_npu.npu_moe_token_permute: (permuted_tokens, sorted_indices); differentiable w.r.t. tokens."""
    if _needs_grad(tokens):
        return _TokenPermute.apply(tokens, indices, num_out_tokens, padded_mode)
    return ops.moe_token_permute(tokens, indices, num_out_tokens, padded_mode)


class _TokenUnpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, permuted, sidx, probs, padded_mode, restore_shape):
        ctx.save_for_backward(permuted, sidx, probs)
        return ops.moe_token_unpermute(permuted, sidx, probs, padded_mode, restore_shape)

    @staticmethod
    def backward(ctx, d_out):
        permuted, sidx, probs = ctx.saved_tensors
        dp, dprobs = ops.moe_token_unpermute_backward(d_out.contiguous(), permuted, sidx, probs)
        return dp, None, _grad_as(dprobs, probs), None, None


def moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """torch_npu.npu_moe_token_unpermute; differentiable w.r.t. permuted_tokens and probs."""
    if _needs_grad(permuted_tokens, probs):
        return _TokenUnpermute.apply(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)
    return ops.moe_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, restore_shape)


class _Finalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ex, erow, x1, x2, bias, scales, expert_idx, mode):
        ctx.save_for_backward(ex, erow, bias, scales, expert_idx)
        ctx.args = (mode, x1 is not None, x2 is not None)
        return ops.moe_finalize_routing_v2(ex, erow, x1=x1, x2=x2, bias=bias, scales=scales, expert_idx=expert_idx,
                                           drop_pad_mode=mode)

    @staticmethod
    def backward(ctx, d_out):
        ex, erow, bias, scales, expert_idx = ctx.saved_tensors
        mode, has1, has2 = ctx.args
        d_out = d_out.contiguous()
        dex, dsc, db = ops.moe_finalize_routing_v2_backward(d_out, ex, erow, scales, bias, expert_idx, mode)
        return (dex, None, d_out if has1 else None, d_out if has2 else None, _grad_as(db, bias),
                _grad_as(dsc, scales), None, None)


def moe_finalize_routing_v2(expanded_x, expanded_row_idx, *, x1=None, x2=None, bias=None, scales=None, expert_idx=None,
                            drop_pad_mode=0):
    """torch_npu.npu_moe_finalize_routing_v2; differentiable w.r.t. expanded_x, x1, x2, bias and scales."""
    if _needs_grad(expanded_x, x1, x2, bias, scales):
        return _Finalize.apply(expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, drop_pad_mode)
    return ops.moe_finalize_routing_v2(expanded_x, expanded_row_idx, x1=x1, x2=x2, bias=bias, scales=scales,
                                       expert_idx=expert_idx, drop_pad_mode=drop_pad_mode)


def moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                         export_for_source_row, drop_pad_mode=0):
    """torch_npu.npu_moe_finalize_routing (= v2 with these arguments); differentiable as v2."""
    if _needs_grad(expanded_permuted_rows, skip1, skip2, bias, scales):
        return _Finalize.apply(expanded_permuted_rows, expanded_src_to_dst_row, skip1, skip2, bias, scales,
                               export_for_source_row, drop_pad_mode or 0)
    return ops.moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                                    export_for_source_row, drop_pad_mode)


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
                   act_type=0, output_dtype=None, antiquant_scale=None, antiquant_offset=None, antiquant_group_size=0,
                   activation_quant="none"):
    """torch_npu.npu_grouped_matmul, M-split: y[rows of g] = act(x[rows of g] @ weight[g] + bias[g]).
    x = [x [M, K]]; weight = [W [G, K, N]] (or its transposed view of [G, N, K]) or G tensors [K, N];
    act_type 0 none, 1 relu, 2 gelu, 5 silu, 6 swiglu. Differentiable (x, weight, bias) when the
    library's grouped_matmul_backward is built and one x and one weight tensor are given.
    Quantised weights (forward only): weight = [codes] from quantize_weights (int8 [G, K, N], or int4
    two a byte as uint8 [G, K, (N + 1) / 2]) with antiquant_scale = [scale] ([G, N] or
    [G, K / group, N]), antiquant_offset = [offset] or None, antiquant_group_size = 0 or the group.
    activation_quant="int8_per_token" (int8 codes only, W8A8): x's rows are quantised per token to
    int8 inside the call (d = max|row| / 127, round half to even) and multiplied on the int8 dot
    product; lossy against weight-only (~1% relative), faster at prefill."""
    if antiquant_scale is not None:
        return ops.grouped_matmul(x, weight, bias=bias, group_list=group_list, split_item=split_item,
                                  group_type=group_type, group_list_type=group_list_type, act_type=act_type,
                                  output_dtype=output_dtype, antiquant_scale=antiquant_scale,
                                  antiquant_offset=antiquant_offset, antiquant_group_size=antiquant_group_size,
                                  activation_quant=activation_quant)
    if activation_quant != "none":
        raise RuntimeError("grouped_matmul: argument 'activation_quant': expected 'none' without antiquant_scale "
                           "(W8A8 takes int8 antiquant weights)")
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


def quantize_weights(w, format="int8", group_size=0, symmetric=True):
    """Weight-only quantisation of w [G, K, N] or [K, N] (fp32 / bf16 / fp16): returns (codes,
    antiquant_scale, antiquant_offset or None) with w ~= (q + offset) * scale. format 'int8' (codes
    int8 [G, K, N]) or 'int4' (uint8 [G, K, (N + 1) / 2], column 2j in the low nibble); group_size 0
    (per output channel) or 32 / 64 / 128 along K. Round to nearest, ties away from zero, clamped."""
    return ops.quantize_weights(w, format, group_size, symmetric)


def dequantize_weights(weight, antiquant_scale, antiquant_offset=None, antiquant_group_size=0):
    """(q + offset) * scale as fp32 [G, K, N]: the plain dequantisation of quantize_weights' output."""
    return ops.dequantize_weights(weight, antiquant_scale, antiquant_offset, antiquant_group_size)


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
        ctx.save_for_backward(probs, counts)
        ctx.args = (k, coeff)
        return torch.tensor(ops.moe_aux_loss(probs, counts, k, coeff), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        probs, counts = ctx.saved_tensors
        k, coeff = ctx.args
        if HAS_BACKWARD:
            g = ops.moe_aux_loss_backward(probs, counts, k, coeff, float(grad))
        else:  # closed form
            T, E = probs.shape
            g = (grad * coeff * E / (k * T * T) * counts.float()).expand(T, E)
        return g.to(probs.dtype), None, None, None


class _ZLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, coeff, mask):
        ctx.save_for_backward(logits, mask)
        ctx.coeff = coeff
        return torch.tensor(ops.moe_z_loss(logits, coeff, mask), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        logits, mask = ctx.saved_tensors
        if HAS_BACKWARD:
            return ops.moe_z_loss_backward(logits, ctx.coeff, mask, float(grad)).to(logits.dtype), None, None
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


_QUANT = ("int8", "int4", "w8a8")


def _quant_args(owner, weights, group_size):
    """(weights, group size) for the C++ store: "float" or a quantised format with its group."""
    if weights is None or weights == "float":
        return "float", 0
    if weights not in _QUANT:
        raise ValueError(f"{owner}: weights must be None, 'int8', 'int4' or 'w8a8', got {weights!r}")
    if group_size is None:
        group_size = 64 if weights == "int4" else 0
    return weights, int(group_size)


def MoeExperts(gate, up, down, layout="torch", weights=None, group_size=None, symmetric=True):
    """Prepacked experts. "torch": gate/up [E, I, H], down [E, H, I] (stacked nn.Linear weights);
    "EHI": gate/up [E, H, I], down [E, I, H]; up=None: gate is the fused [gate | up] tensor.
    weights=None packs them in their dtype; "int8" (per output channel unless group_size) or "int4"
    (group_size 32, 64 (default) or 128; 0 per channel) quantises them once, symmetric or with
    offsets, as quantize_weights does (moe_ffn then dequantises in registers; forward only);
    "w8a8": int8 codes, and every expert input row quantised per token to int8 (prefill speed).
    Methods: set_expert(e, gate, up, down, layout) replaces (e < E) or appends (e == E) one expert
    without repacking the others (float stores); remove_expert(e); num_experts(); packed_bytes();
    weights() ("float", "int8", "int4" or "w8a8"); group_size()."""
    w, gs = _quant_args("MoeExperts", weights, group_size)
    return torch.classes.ops_transformer.MoeExperts(gate, up, down, layout, w, gs, bool(symmetric))


def moe_ffn(x, router, experts, k=2, **kwargs):
    """The whole MoE layer forward: router -> top-k -> grouped SwiGLU FFN -> weighted combine.
    x [T, H]. Inference: router a PackedWeight of the [E, H] gate, experts a MoeExperts (packed once).
    Training: router the [E, H] weight tensor and experts a (gate, up, down) tuple of stacked
    nn.Linear weights ([E, I, H], [E, I, H], [E, H, I]; layout="EHI" for [E, H, I] / [E, I, H]),
    optional shared=(gate [Is, H], up [Is, H], down [H, Is]); then y and router_logits are
    differentiable w.r.t. x, router, the experts, shared and residual (moe_ffn_backward).
    Returns (y, router_logits, topk_ids, topk_weights, expert_counts, dropped)."""
    if isinstance(router, torch.Tensor):
        return _moe_ffn_train(x, router, experts, k=k, **kwargs)
    return _MOE_FFN(x, router, experts, k=k, **kwargs)


class _MoeFfn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, router, gate, up, down, sg, su, sd, residual, kw, info):
        y, logits, ids, w, counts, dropped, saved = ops.moe_ffn_forward_train(
            x, router, gate, up, down, shared_gate=sg, shared_up=su, shared_down=sd, residual=residual, **kw)
        info.append(dropped)
        ctx.save_for_backward(x, router, gate, up, down, sg, su, sd)
        ctx.saved, ctx.layout, ctx.has_res = saved, kw.get("layout", "torch"), residual is not None
        ctx.mark_non_differentiable(ids, w, counts)
        return y, logits, ids, w, counts

    @staticmethod
    def backward(ctx, dy, dlogits, *_):
        x, router, gate, up, down, sg, su, sd = ctx.saved_tensors
        dy = torch.zeros_like(x) if dy is None else dy.to(x.dtype)
        # bf16 experts get their gradients in bf16 from the library (rounded once from the fp32 sum,
        # as .to(bf16) would, but with half the bytes written); other dtypes get fp32.
        gdt = torch.bfloat16 if gate.dtype == up.dtype == down.dtype == torch.bfloat16 else None
        dx, dr, dg, du, dd, dsg, dsu, dsd, _, _ = ops.moe_ffn_backward(
            dy, x, router, gate, up, down, ctx.saved, shared_gate=sg, shared_up=su, shared_down=sd, layout=ctx.layout,
            weight_grad_dtype=gdt)
        if dlogits is not None:  # losses on the router logits (aux, z): logits = x router^T
            dl = dlogits.float()
            dx = (dx.float() + dl @ router.float()).to(x.dtype)
            dr = dr + dl.t() @ x.float()
        return (dx, _grad_as(dr, router), _grad_as(dg, gate), _grad_as(du, up), _grad_as(dd, down), _grad_as(dsg, sg),
                _grad_as(dsu, su), _grad_as(dsd, sd), dy if ctx.has_res else None, None, None)


def _moe_ffn_train(x, router, experts, k=2, shared=None, residual=None, **kw):
    gate, up, down = experts
    sg, su, sd = shared if shared is not None else (None, None, None)
    if isinstance(sg, torch.ScriptObject):
        raise TypeError("moe_ffn: argument 'shared': expected (gate, up, down) tensors with a weight-tensor router")
    info = []
    y, logits, ids, w, counts = _MoeFfn.apply(x.contiguous(), router, gate, up, down, sg, su, sd, residual,
                                              dict(kw, k=k), info)
    return y, logits, ids, w, counts, info[0]


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


class _StackedExperts(torch.autograd.Function):
    """The experts' weights [E, ...] as one tensor without a copy when they are consecutive slices
    of one buffer (share_expert_storage); gradients go back as the slices of the stacked one."""

    @staticmethod
    def forward(ctx, *ws):
        w0 = ws[0]
        return w0.detach().as_strided((len(ws),) + tuple(w0.shape), (w0.numel(),) + tuple(w0.stride()))

    @staticmethod
    def backward(ctx, g):
        return g.unbind(0)


def _consecutive(ws):
    w0 = ws[0]
    step = w0.numel() * w0.element_size()
    return w0.is_contiguous() and all(
        w.dtype == w0.dtype and w.shape == w0.shape and w.is_contiguous() and w.data_ptr() == w0.data_ptr() + i * step
        for i, w in enumerate(ws))


def _stack(ws, dtype):
    if ws[0].dtype == dtype and _consecutive(ws):
        return _StackedExperts.apply(*ws)
    return torch.stack([w.to(dtype) for w in ws])  # (a copy: the gradients flow back through it)


def share_expert_storage(experts, names=("gate_proj", "up_proj", "down_proj")):
    """Re-homes each named Linear weight of the experts into one [E, out, in] buffer (values, names
    and state_dict unchanged; each weight stays its own Parameter, a slice of the buffer), so the
    training path reads the stacked experts in place instead of copying them every step. Moving a
    module to another dtype or device gives the weights separate storage again (the copy path)."""
    with torch.no_grad():
        for name in names:
            lins = [getattr(e, name) for e in experts]
            buf = torch.stack([m.weight.detach() for m in lins])
            for i, m in enumerate(lins):
                m.weight = nn.Parameter(buf[i], requires_grad=m.weight.requires_grad)
    return experts


def _train_step(x, router_w, weights, dtype, **kw):
    """The differentiable layer on the modules' own parameters, cast to the compute dtype: stacked
    in place where they share one buffer, else copied (the gradients reach every expert either way)."""
    st = [_stack(list(ws), dtype) for ws in weights]
    return moe_ffn(x, router_w.to(dtype), tuple(st), **kw)


class ExpertParallel(nn.Module):
    """Runs a list of FFN experts as one fused MoE layer on prepacked weights.

    experts: nn.Modules with gate_proj/up_proj/down_proj (Qwen3-MoE, Llama) or w1/w3/w2 (Mixtral)
    Linear layers, all of the same shape; packed once (call repack() after changing them).
    gate: the router Linear(H, E, bias=False) (created when None). forward(x [..., H]) -> y [..., H].
    After each call: aux_loss (Switch load-balancing loss of that call, a 0-d tensor),
    expert_counts [E] and dropped (pairs over capacity). capacity_factor=None is dropless.
    Trainable: with grad enabled and x or a parameter requiring grad, the call runs the
    differentiable layer on the parameters themselves (gradients reach x, the router and every
    expert, and aux_loss back-propagates into the router); the packed copy is refreshed at the next
    inference call."""

    def __init__(self, experts, top_k=2, capacity_factor=1.2, precision="bf16", gate=None, norm_topk_prob=False):
        super().__init__()
        experts = list(experts)
        if not experts:
            raise ValueError("ExpertParallel: experts must not be empty")
        if precision not in _DTYPES and precision not in _QUANT:
            raise ValueError(f"ExpertParallel: precision must be one of {sorted(_DTYPES) + list(_QUANT)}, got {precision!r}")
        self.experts = nn.ModuleList(experts)
        gw, _, _ = _expert_weights(experts[0])
        self.hidden_size = gw.shape[1]
        self.gate = gate if gate is not None else nn.Linear(self.hidden_size, len(experts), bias=False)
        self.top_k, self.capacity_factor, self.norm_topk_prob = top_k, capacity_factor, norm_topk_prob
        # int8 / int4: bf16 activations on experts quantised at repack (int4 in groups of 64).
        self.dtype = _DTYPES.get(precision, torch.bfloat16)
        self._quant = _quant_args("ExpertParallel", precision if precision in _QUANT else None, None)
        self._router = _RouterCache()
        self.aux_loss = self.expert_counts = None
        self.dropped = 0
        self.repack()

    @torch.no_grad()
    def repack(self):
        """Packs every expert again (after their weights changed)."""
        g, u, d = zip(*(_expert_weights(e) for e in self.experts))
        st = lambda ws: torch.stack([w.detach().to(self.dtype) for w in ws])
        self._packed = MoeExperts(st(g), st(u), st(d), "torch", *self._quant)

    @torch.no_grad()
    def set_expert(self, i, expert):
        """Replaces expert i (or appends when i == number of experts) and packs only that one
        (a quantised store is rebuilt whole)."""
        if self._quant[0] != "float":
            if not 0 <= i <= len(self.experts):
                raise IndexError(f"ExpertParallel.set_expert: i must be in [0, {len(self.experts)}], got {i}")
            if i == len(self.experts):
                self.experts.append(expert)
            else:
                self.experts[i] = expert
            self.repack()
            return
        g, u, d = (w.detach().to(self.dtype) for w in _expert_weights(expert))
        self._packed.set_expert(i, g, u, d, "torch")
        if i == len(self.experts):
            self.experts.append(expert)
        else:
            self.experts[i] = expert

    def _training(self, x):
        if not torch.is_grad_enabled() or not (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            return False
        if not HAS_BACKWARD:
            raise NotImplementedError("ExpertParallel: the MoE backward is not built into this library")
        return True

    def forward(self, x):
        shape = x.shape
        xt = x.reshape(-1, self.hidden_size).to(self.dtype)
        cf = float(self.capacity_factor or 0.0)
        if xt.shape[0] and self._training(x):
            weights = zip(*(_expert_weights(e) for e in self.experts))
            y, logits, ids, _, counts, dropped = _train_step(xt, self.gate.weight, weights, self.dtype, k=self.top_k,
                                                             norm_topk_prob=self.norm_topk_prob, capacity_factor=cf)
            self._stale = True
        else:
            if getattr(self, "_stale", False):
                self.repack()
                self._stale = False
            y, logits, ids, _, counts, dropped = _MOE_FFN(
                xt, self._router.get(self.gate.weight, self.dtype), self._packed, k=self.top_k,
                norm_topk_prob=self.norm_topk_prob, capacity_factor=cf)
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
    at the first call after construction or load_state_dict; call repack() after editing them.
    weights="int8" / "int4" / "w8a8" (group_size, symmetric: see MoeExperts) quantises the experts at that
    packing for inference; the parameters stay in their dtype (training runs on them)."""

    def __init__(self, hidden_size, num_experts, intermediate_size, top_k, norm_topk_prob=True, dtype=None, weights=None,
                 group_size=None, symmetric=True):
        super().__init__()
        self.hidden_size, self.num_experts, self.intermediate_size = hidden_size, num_experts, intermediate_size
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.weights, self.group_size = _quant_args("SparseMoeBlock", weights, group_size)
        self.symmetric = symmetric
        self.gate = nn.Linear(hidden_size, num_experts, bias=False, dtype=dtype)
        self.experts = share_expert_storage(nn.ModuleList(_MLP(hidden_size, intermediate_size, dtype) for _ in range(num_experts)))
        self._packed = None
        self._router = _RouterCache()
        self._register_load_state_dict_pre_hook(lambda *a, **k: self.repack(lazy=True))

    @torch.no_grad()
    def repack(self, lazy=False):
        """Packs (weights="int8" / "int4": quantises) the experts' parameters for inference."""
        if lazy:
            self._packed = None
            return
        st = lambda name: torch.stack([getattr(e, name).weight.detach() for e in self.experts])
        self._packed = MoeExperts(st("gate_proj"), st("up_proj"), st("down_proj"), "torch", self.weights, self.group_size,
                                  self.symmetric)

    @classmethod
    def from_mixtral_state_dict(cls, state_dict, top_k=2, norm_topk_prob=True, prefix="", weights=None, group_size=None,
                                symmetric=True):
        """Builds a block from a Mixtral MoE block's state_dict (gate.weight, experts.{i}.w1/w2/w3.weight)."""
        gate = state_dict[prefix + "gate.weight"]
        E, H = gate.shape
        inter = state_dict[prefix + "experts.0.w1.weight"].shape[0]
        block = cls(H, E, inter, top_k, norm_topk_prob, dtype=gate.dtype, weights=weights, group_size=group_size,
                    symmetric=symmetric)
        names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        sd = {"gate.weight": gate}
        for i in range(E):
            for src, dst in names.items():
                sd[f"experts.{i}.{dst}.weight"] = state_dict[f"{prefix}experts.{i}.{src}.weight"]
        block.load_state_dict(sd)
        return block

    def forward(self, hidden_states):
        shape = hidden_states.shape
        dtype = self.gate.weight.dtype
        x = hidden_states.reshape(-1, self.hidden_size).to(dtype)
        training = x.shape[0] and torch.is_grad_enabled() and (
            hidden_states.requires_grad or any(p.requires_grad for p in self.parameters()))
        if training:
            if not HAS_BACKWARD:
                raise NotImplementedError("SparseMoeBlock: the MoE backward is not built into this library")
            weights = ([getattr(e, n).weight for e in self.experts] for n in ("gate_proj", "up_proj", "down_proj"))
            y, logits, *_ = _train_step(x, self.gate.weight, weights, dtype, k=self.top_k,
                                        norm_topk_prob=self.norm_topk_prob)
            self._packed = None  # parameters may change (optimizer step): repack at the next inference call
        else:
            if self._packed is None:
                self.repack()
            y, logits, *_ = _MOE_FFN(x, self._router.get(self.gate.weight, dtype), self._packed, k=self.top_k,
                                        norm_topk_prob=self.norm_topk_prob)
        return y.to(hidden_states.dtype).reshape(shape), logits.to(dtype)
