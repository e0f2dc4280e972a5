"""The Gated DeltaNet layer's operators around its core, on the library's CPU kernels (names of the
causal-conv1d package and fla; x channels-last as in fla):

    y, final = causal_conv1d_fn(x, weight, bias=None, initial_states=None, return_final_states=False,
                                activation="silu", cu_seqlens=None)
    y = causal_conv1d_update(x, conv_state, weight, bias=None, activation="silu", conv_state_indices=None)
    y = rms_norm_gated(x, z, weight, eps=1e-6, norm_before_gate=True, group_size=None)
    RMSNormGated(hidden_size, eps=1e-6, norm_before_gate=True, group_size=None)   # module
    y = rms_norm(x, weight, eps=1e-6)                  # weight * x / sqrt(mean(x^2) + eps)
    y, x_sum = add_rms_norm(x, residual, weight, eps=1e-6)   # x_sum = x + residual, y = rms_norm(x_sum)
    RMSNorm(hidden_size, eps=1e-6); norm(x) or norm(x, residual) -> (y, x_sum)   # module
    y = rotary_mul(x, cos, sin)    # x * cos + rotate_half(x) * sin (torch_npu's npu_rotary_mul)
    o = causal_attention(q, k, v, scale)   # causal softmax attention, scores never in memory
    y = linear(x, weight)          # x @ weight^T on the library's matrix engine (nn.Linear without bias)
    Linear(in, out, bias=False); use_library_linear(module)   # nn.Linear on it / swap a model's Linears
    outs = linear_group(x, [lin1, lin2, ...])   # several bias-free Linears of one input in one product

x [B, T, D] (varlen: B = 1 and cu_seqlens [N+1] int32/int64 on the CPU); weight [D, W] or nn.Conv1d's
[D, 1, W] (W in 2..8); states [N, D, W-1], oldest input first. causal_conv1d_update advances a conv
state cache [num_slots, D, W-1] in place (x [B, D] or [B, S, D]; row b uses slot
conv_state_indices[b], int32, negative = padded row). rms_norm_gated: y = rmsnorm(x) * weight * silu(z)
(norm_before_gate, fla's FusedRMSNormGated and HF Qwen3NextRMSNormGated) or rmsnorm(x * silu(z)) *
weight, over groups of group_size values of the last dim; statistics in fp32, y in x's dtype.
rms_norm / add_rms_norm: torch_npu's npu_rms_norm / npu_add_rms_norm (HF's RMSNorm with its
statistics in fp32), y in x's dtype; x_sum rounded to x's dtype, then normalised: the same bits as
x + residual followed by rms_norm. fp32, bf16 and fp16 tensors; gradients flow through
causal_conv1d_fn, rms_norm_gated, rms_norm and add_rms_norm."""
import weakref

import torch
import torch.nn as nn

from ._lib import fast_op, ops

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "rms_norm_gated", "RMSNormGated", "rms_norm", "add_rms_norm",
           "RMSNorm", "rotary_mul", "causal_attention", "linear", "Linear", "linear_group", "use_library_linear", "bmm"]


def _cu(cu_seqlens):
    if cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens
    return torch.tensor(list(cu_seqlens), dtype=torch.int64)


def _w2(weight):
    """[D, W] view of a [D, W] or [D, 1, W] conv weight."""
    return weight.reshape(weight.shape[0], weight.shape[-1])


class _CausalConv1d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, initial_states, return_final_states, activation, cu_seqlens):
        w = _w2(weight)
        y, final = ops.causal_conv1d_fn(x, w, bias, initial_states, return_final_states, activation, cu_seqlens)
        ctx.save_for_backward(x, w, bias, initial_states, cu_seqlens)
        ctx.args = (activation, weight.shape, weight.dtype)
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, w, bias, s0, cu = ctx.saved_tensors
        activation, wshape, wdtype = ctx.args
        dx, dw, db, ds0 = ops.causal_conv1d_bwd(x, w, dy, bias, s0, dfinal, activation, cu)
        dw = dw.to(wdtype).reshape(wshape)
        if db is not None:
            db = db.to(bias.dtype)
        return dx, dw, db, ds0, None, None, None


def causal_conv1d_fn(x, weight, bias=None, initial_states=None, return_final_states=False, activation="silu",
                     cu_seqlens=None):
    """Depthwise causal conv over time (+ SiLU): y[t, d] = act(bias[d] + sum_k weight[d, k] x[t-W+1+k, d]),
    the inputs before a sequence's start taken from its initial state (zeros without one). Returns
    (y [B, T, D] in x's dtype, final_states [N, D, W-1] in x's dtype or None)."""
    cu = _cu(cu_seqlens)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, initial_states))
    if not needs_grad:
        return ops.causal_conv1d_fn(x, _w2(weight), bias, initial_states, return_final_states, activation, cu)
    return _CausalConv1d.apply(x, weight, bias, initial_states, return_final_states, activation, cu)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation="silu", conv_state_indices=None):
    """One decode step (or S tokens) on the conv state cache, updated in place (forward only)."""
    return ops.causal_conv1d_update(x, conv_state, _w2(weight), bias, activation, conv_state_indices)


class _RmsNormGated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, weight, eps, norm_before_gate, group_size):
        y, rstd = ops.rms_norm_gated(x, z, weight, eps, norm_before_gate, group_size)
        ctx.save_for_backward(x, z, weight, rstd)
        ctx.args = (eps, norm_before_gate, group_size)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, z, weight, rstd = ctx.saved_tensors
        eps, norm_before_gate, group_size = ctx.args
        dx, dz, dw = ops.rms_norm_gated_bwd(dy, x, z, weight, rstd, eps, norm_before_gate, group_size)
        return dx, dz, dw.to(weight.dtype), None, None, None


def rms_norm_gated(x, z, weight, eps=1e-6, norm_before_gate=True, group_size=None):
    """Gated RMSNorm over the last dim (groups of group_size values; None: the whole dim)."""
    group = 0 if group_size is None else int(group_size)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, z, weight)):
        return _RmsNormGated.apply(x, z, weight, float(eps), bool(norm_before_gate), group)
    return ops.rms_norm_gated(x, z, weight, float(eps), bool(norm_before_gate), group)[0]


class RMSNormGated(nn.Module):
    """fla's FusedRMSNormGated / mamba's RMSNormGated: forward(x, z) = rms_norm_gated(x, z, weight, ...)."""

    def __init__(self, hidden_size, eps=1e-6, norm_before_gate=True, group_size=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps, self.norm_before_gate, self.group_size = eps, norm_before_gate, group_size

    def forward(self, x, z):
        return rms_norm_gated(x, z, self.weight, self.eps, self.norm_before_gate, self.group_size)


_RMS_NORM, _ADD_RMS_NORM, _RMS_NORM_BWD = fast_op("rms_norm"), fast_op("add_rms_norm"), fast_op("rms_norm_backward")


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = _RMS_NORM(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _RMS_NORM_BWD(dy, x, weight, rstd, ctx.eps, None)
        return dx, dw.to(weight.dtype), None


class _AddRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, rstd, x_sum = _ADD_RMS_NORM(x, residual, weight, eps)
        ctx.save_for_backward(x_sum, weight, rstd)
        ctx.eps = eps
        return y, x_sum

    @staticmethod
    def backward(ctx, dy, dx_sum):
        x_sum, weight, rstd = ctx.saved_tensors
        dx, dw = _RMS_NORM_BWD(dy, x_sum, weight, rstd, ctx.eps, dx_sum)  # x_sum's other uses added in the kernel
        return dx, dx, dw.to(weight.dtype), None


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def rms_norm(x, weight, eps=1e-6):
    """weight * x / sqrt(mean(x^2, -1) + eps), statistics in fp32, y in x's dtype; differentiable."""
    if _needs_grad(x, weight):
        return _RmsNorm.apply(x, weight, float(eps))
    return _RMS_NORM(x, weight, float(eps))[0]


def add_rms_norm(x, residual, weight, eps=1e-6):
    """(rms_norm(x + residual), x + residual) in one pass (x + residual rounded to x's dtype first)."""
    if _needs_grad(x, residual, weight):
        return _AddRmsNorm.apply(x, residual, weight, float(eps))
    y, _, x_sum = _ADD_RMS_NORM(x, residual, weight, float(eps))
    return y, x_sum


class RMSNorm(nn.Module):
    """HF-style RMSNorm (parameter `weight`, ones at init) on rms_norm; forward(x, residual) returns
    (rms_norm(x + residual), x + residual) by add_rms_norm."""

    def __init__(self, hidden_size, eps=1e-6, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x, residual=None):
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)


_ROTARY, _ROTARY_BWD = fast_op("rotary_mul"), fast_op("rotary_mul_backward")


class _RotaryMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _ROTARY(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _ROTARY_BWD(dy, cos, sin), None, None


def rotary_mul(x, cos, sin):
    """x * cos + rotate_half(x) * sin (HF's apply_rotary_pos_emb for one tensor), x [..., T, D],
    cos / sin [T, D]; differentiable in x."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _RotaryMul.apply(x, cos, sin)
    return _ROTARY(x, cos, sin)


_ATTN, _ATTN_BWD = fast_op("causal_attention"), fast_op("causal_attention_backward")


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale):
        o, lse = _ATTN(q, k, v, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _ATTN_BWD(do, q, k, v, o, lse, ctx.scale)
        return dq, dk, dv, None


def causal_attention(q, k, v, scale):
    """softmax(scale q k^T, causal) v for q [B, H, T, D], k / v [B, H, S, D], the queries being the
    last T of the S positions (a decode step, a prefill onto a KV cache); differentiable. The score
    matrix stays in the library's per-thread scratch."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _CausalAttention.apply(q, k, v, float(scale))
    return _ATTN(q, k, v, float(scale))[0]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight):
        ctx.save_for_backward(x2, weight)
        return ops.matmul(x2, weight.t())

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        dx = ops.matmul(dy, w) if ctx.needs_input_grad[0] else None
        dw = ops.matmul(dy.t(), x2).to(w.dtype) if ctx.needs_input_grad[1] else None
        return dx, dw


def linear(x, weight):
    """x [..., K] @ weight[N, K]^T on the library's matmul (fp32 accumulation, transposes as strides);
    differentiable (dx = dy W, dW = dy^T x, both on the library's matmul)."""
    x2 = x.reshape(-1, x.shape[-1])
    # The matmul packs its right operand on every call: for a few rows without a backward (decode)
    # torch's GEMV-shaped product is cheaper (~20 us against ~70 us for 1 x 128 x 256).
    few_rows = x2.shape[0] <= 16 and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    if x2.shape[0] == 0 or few_rows or x.dtype != weight.dtype:
        return torch.nn.functional.linear(x, weight)
    return _Linear.apply(x2, weight).reshape(*x.shape[:-1], weight.shape[0])


class _Bmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _BMM(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        da = _BMM(dc, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        db = _BMM(a.transpose(1, 2), dc) if ctx.needs_input_grad[1] else None
        return da, db


_BMM = fast_op("bmm")


def bmm(a, b):
    """a [..., M, K] @ b [..., K, N] over the leading dims on the library's matmul (a product per
    thread, fp32 accumulation, transposes as strides); differentiable. torch.matmul where the op is
    missing or the dtypes differ."""
    if _BMM is None or a.dtype != b.dtype or a.shape[:-2] != b.shape[:-2] or a.dim() < 3:
        return torch.matmul(a, b)
    lead = a.shape[:-2]
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        c = _Bmm.apply(a3, b3)
    else:
        c = _BMM(a3, b3)
    return c.reshape(*lead, a.shape[-2], b.shape[-1])


_LINEAR_PACKED = fast_op("linear_packed")
# Linear module -> (weight key, its PackedWeight): outside the module, so copies and pickles of a
# module never meet the torch.classes object; freed with the module.
_PACKED_LINEARS = weakref.WeakKeyDictionary()


class Linear(nn.Linear):
    """nn.Linear (same parameters and state_dict) whose product runs on the library's matmul. Without
    a backward, a few rows (decode) run on the weight packed once and kept until it changes (its
    data pointer, version counter or dtype; a second copy of the weight while it lives), not on
    torch's GEMV."""

    def forward(self, x):
        w = self.weight
        # (no reshape around the op: it takes [..., K]; each reshape was 2 us of a 12 us call)
        if (_LINEAR_PACKED is not None and 0 < x.numel() <= 16 * w.shape[1] and x.dtype == w.dtype
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            y = _LINEAR_PACKED(x, packed_weight(self))
        else:
            y = linear(x, w)
        return y if self.bias is None else y + self.bias


# First Linear of a group -> (weight keys, PackedWeight of the group's concatenated weights).
_PACKED_GROUPS = weakref.WeakKeyDictionary()


def packed_weight(linear):
    """The PackedWeight of a Linear's weight (no-grad use), packed once and again when it changes
    (its data pointer, version counter or dtype)."""
    w = linear.weight
    key = (w.data_ptr(), w._version, w.dtype)
    cache = _PACKED_LINEARS.get(linear)
    if cache is None or cache[0] != key:
        cache = (key, torch.classes.ops_transformer.PackedWeight(w.detach(), "torch"))
        _PACKED_LINEARS[linear] = cache
    return cache[1]


def packed_group(linears):
    """The PackedWeight of several Linears' weights concatenated by rows (linear_group's), cached
    as packed_weight."""
    key = tuple((m.weight.data_ptr(), m.weight._version, m.weight.dtype) for m in linears)
    cache = _PACKED_GROUPS.get(linears[0])
    if cache is None or cache[0] != key:
        cache = (key, torch.classes.ops_transformer.PackedWeight(torch.cat([m.weight.detach() for m in linears]), "torch"))
        _PACKED_GROUPS[linears[0]] = cache
    return cache[1]


def linear_group(x, linears):
    """The outputs of several bias-free Linears of one input as one product: x @ cat(weights)^T,
    split back by output (a decode step's four GDN in-projections: one call, not four). Without a
    backward, few rows run on the concatenation packed once (repacked when any weight changes);
    otherwise the product is differentiable and each weight gets its slice of the gradient."""
    ws = [m.weight for m in linears]
    sizes = [w.shape[0] for w in ws]
    if (_LINEAR_PACKED is not None and 0 < x.numel() <= 16 * ws[0].shape[1] and x.dtype == ws[0].dtype
            and not (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in ws)))):
        y = _LINEAR_PACKED(x, packed_group(linears))
    else:
        y = linear(x, torch.cat(ws))
    return y.split(sizes, -1)


def use_library_linear(module):
    """Turns every nn.Linear inside module into a Linear in place (parameters kept); returns module."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = Linear
    return module
