"""Gated DeltaNet: fla's functional API on the library's CPU kernels, and the Qwen3-Next / Qwen3.5
GatedDeltaNet layer.

    o, final = chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                      output_final_state=False, cu_seqlens=None,
                                      use_qk_l2norm_in_kernel=False)
    o, final = fused_recurrent_gated_delta_rule(q, k, v, g, beta, ...)      # decode / short T

Shapes (fla, time-major): q, k [B, T, HK, DK]; v [B, T, HV, DV]; g, beta [B, T, HV] (HV a multiple
of HK: value head h reads key head h // (HV/HK)); states [N, HV, DK, DV] fp32. Varlen: B = 1 and
cu_seqlens [N+1] (int64 or int32, on the CPU). layout="BNSD" takes head-major tensors instead.
Gradients flow through chunk_gated_delta_rule when the library's GDN backward is built
(ops_transformer.gdn.HAS_BACKWARD); otherwise backward raises."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._lib import fast_op, has_op, ops
from .layers import (Linear, causal_conv1d_fn, causal_conv1d_update, linear_group, packed_group, packed_weight,
                     rms_norm_gated)

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "recurrent_gated_delta_rule",
           "GatedDeltaNet", "GatedDeltaNetCache", "HAS_BACKWARD"]

HAS_BACKWARD = has_op("chunk_gated_delta_rule_bwd")
_FUSED_RECURRENT = fast_op("fused_recurrent_gated_delta_rule")
_RECURRENT = fast_op("recurrent_gated_delta_rule")
_DECODE = fast_op("gated_delta_net_decode")


def _as_tensor_cu(cu_seqlens):
    if cu_seqlens is None or isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens
    return torch.tensor(list(cu_seqlens), dtype=torch.int64)


class _ChunkGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, output_final_state, cu_seqlens, l2norm, layout,
                final_state_dtype, save_states):
        o, final, g_cumsum, A, _, _, h, v_new = ops.chunk_gated_delta_rule_fwd(
            q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm,
            layout=layout, save_for_backward=True, final_state_dtype=final_state_dtype, save_states=save_states)
        ctx.save_for_backward(q, k, v, g, beta, initial_state, g_cumsum, A, cu_seqlens, h, v_new)
        ctx.args = (scale, l2norm, layout)
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        if not HAS_BACKWARD:
            raise NotImplementedError(
                "ops_transformer: the GDN backward (chunk_gated_delta_rule_bwd) is not built into this library yet")
        q, k, v, g, beta, s0, g_cumsum, A, cu, h, v_new = ctx.saved_tensors
        scale, l2norm, layout = ctx.args
        dq, dk, dv, dg, dbeta, dh0 = ops.chunk_gated_delta_rule_bwd(
            q, k, v, g_cumsum, beta, do.contiguous(), scale=scale, initial_state=s0,
            dht=None if dht is None else dht.float(),
            use_qk_l2norm_in_kernel=l2norm, A=A, cu_seqlens=cu, layout=layout, h=h, v_new=v_new)
        if dh0 is not None:
            dh0 = dh0.to(s0.dtype)
        return (dq, dk, dv, dg.to(g.dtype), dbeta.to(beta.dtype), dh0, None, None, None, None, None, None, None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, layout="BTHD", final_state_dtype=None,
                           save_states=True):
    """Chunked Gated DeltaNet (prefill / training). Returns (o, final_state or None).
    initial_state may be fp32, bf16 or fp16 (read as fp32); the state is carried in fp32 and the
    final state returned in fp32 (fla's convention) unless final_state_dtype asks otherwise.
    When gradients are needed and save_states is true (default), the forward keeps its chunk
    states h and v_new for the backward (fp32, 4 DK DV / 64 + 4 DV bytes a token and value head:
    1.5 KiB at 128 / 128), which then skips recomputing them (~1.45x faster at Qwen3.5 shapes);
    save_states=False recomputes them (fla's memory footprint)."""
    cu_seqlens = _as_tensor_cu(cu_seqlens)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state))
    if not needs_grad:
        return ops.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                          use_qk_l2norm_in_kernel, layout=layout, final_state_dtype=final_state_dtype)
    return _ChunkGDN.apply(q, k, v, g, beta, initial_state, scale, output_final_state, cu_seqlens,
                           use_qk_l2norm_in_kernel, layout, final_state_dtype, save_states)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                                     A_log=None, dt_bias=None, beta_sigmoid=False, layout="BTHD", final_state_dtype=None):
    """Token-by-token recurrence (decode, speculative verification); forward only, as in fla.
    initial_state fp32, bf16 or fp16; final state fp32 unless final_state_dtype asks otherwise.
    With A_log and dt_bias, g holds the raw `a` (g = -exp(A_log) softplus(a + dt_bias)); with
    beta_sigmoid, beta holds the raw `b` (beta = sigmoid(b))."""
    cu = _as_tensor_cu(cu_seqlens)
    if A_log is None and dt_bias is None and not beta_sigmoid and layout == "BTHD" and final_state_dtype is None:
        # positional: the cheapest call
        return _FUSED_RECURRENT(q, k, v, g, beta, scale, initial_state, output_final_state, cu, use_qk_l2norm_in_kernel)
    return _FUSED_RECURRENT(q, k, v, g, beta, scale, initial_state, output_final_state, cu, use_qk_l2norm_in_kernel,
                            A_log=A_log, dt_bias=dt_bias, beta_sigmoid=beta_sigmoid, layout=layout,
                            final_state_dtype=final_state_dtype)


def recurrent_gated_delta_rule(q, k, v, g, beta, state_cache, state_indices, scale=None, cu_seqlens=None,
                               num_accepted_tokens=None, use_qk_l2norm_in_kernel=False, A_log=None, dt_bias=None,
                               beta_sigmoid=False, layout="BTHD"):
    """Decode on a state cache [num_slots, HV, DK, DV] (fp32, or bf16 at half the traffic and ~3
    significant digits; updated in fp32 and rounded once per write) updated in place, addressed by int32
    state_indices ([N] per sequence, or [T] per-token snapshots as Ascend/vLLM MTP). Returns o."""
    return _RECURRENT(
        q, k, v, g, beta, state_cache, state_indices, scale=scale, cu_seqlens=_as_tensor_cu(cu_seqlens),
        num_accepted_tokens=num_accepted_tokens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, A_log=A_log,
        dt_bias=dt_bias, beta_sigmoid=beta_sigmoid, layout=layout)


# ---- the layer ---------------------------------------------------------------------------------

class GatedDeltaNetCache:
    """Per-layer decode state: conv_state [B, conv_dim, kernel-1] (last pre-conv inputs) and
    recurrent_state [B, HV, DK, DV] fp32. Start empty; a forward with it fills or advances it."""

    def __init__(self):
        self.conv_state = None
        self.recurrent_state = None

    @property
    def empty(self):
        return self.recurrent_state is None


def _one_product(linears):
    for p in linears:
        if type(p) is not Linear or p.bias is not None:
            return False
    return True


class GatedDeltaNet(nn.Module):
    """Qwen3-Next / Qwen3.5 linear-attention layer (HF Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet):
    in-projections -> causal depthwise conv1d + SiLU -> beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
    -> GDN core (l2norm on q, k) -> gated RMSNorm (weight * rmsnorm(o) * silu(z)) -> out_proj; the conv
    and the norm run on the library's causal_conv1d_fn / causal_conv1d_update / rms_norm_gated.

    variant="qwen3_next": in_proj_qkvz, in_proj_ba (outputs grouped per key head);
    variant="qwen3_5":    in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
    Parameter names equal HF's, so `load_state_dict(hf_layer.state_dict())` works as is.
    forward(x [B, T, hidden], cache=None): cache=None is plain prefill; an empty GatedDeltaNetCache is
    filled by a prefill; a filled one is advanced by the recurrent (decode) path."""

    def __init__(self, hidden_size, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                 conv_kernel_size=4, rms_norm_eps=1e-6, variant="qwen3_next", dtype=None):
        super().__init__()
        if variant not in ("qwen3_next", "qwen3_5"):
            raise ValueError(f"GatedDeltaNet: variant must be 'qwen3_next' or 'qwen3_5', got {variant!r}")
        if num_v_heads % num_k_heads:
            raise ValueError("GatedDeltaNet: num_v_heads must be a multiple of num_k_heads")
        self.hidden_size, self.variant = hidden_size, variant
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size, self.eps = conv_kernel_size, rms_norm_eps
        kw = {"dtype": dtype}
        if variant == "qwen3_next":
            self.in_proj_qkvz = nn.Linear(hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False, **kw)
            self.in_proj_ba = nn.Linear(hidden_size, 2 * num_v_heads, bias=False, **kw)
        else:
            self.in_proj_qkv = nn.Linear(hidden_size, self.conv_dim, bias=False, **kw)
            self.in_proj_z = nn.Linear(hidden_size, self.value_dim, bias=False, **kw)
            self.in_proj_b = nn.Linear(hidden_size, num_v_heads, bias=False, **kw)
            self.in_proj_a = nn.Linear(hidden_size, num_v_heads, bias=False, **kw)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel_size, groups=self.conv_dim,
                                padding=conv_kernel_size - 1, bias=False, **kw)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads, dtype=dtype))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_v_heads, dtype=torch.float32).uniform_(1, 16)).to(dtype or torch.float32))
        self.norm = _GatedRMSNorm(head_v_dim, rms_norm_eps, dtype)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False, **kw)

    def _project(self, x):
        """x [B, T, hidden] -> mixed_qkv [B, T, conv_dim], z [B, T, HV, dv], b, a [B, T, HV]."""
        B, T, _ = x.shape
        HK, HV, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        G = HV // HK
        if self.variant == "qwen3_next":
            qkvz = self.in_proj_qkvz(x).view(B, T, HK, 2 * dk + 2 * G * dv)
            ba = self.in_proj_ba(x).view(B, T, HK, 2 * G)
            q, k, v, z = torch.split(qkvz, [dk, dk, G * dv, G * dv], dim=3)
            b, a = torch.split(ba, [G, G], dim=3)
            mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)
            return mixed, z.reshape(B, T, HV, dv), b.reshape(B, T, HV), a.reshape(B, T, HV)
        projs = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        if _one_product(projs):  # one product on the library's engine
            qkv, z, b, a = linear_group(x, projs)
        else:
            qkv, z, b, a = (p(x) for p in projs)
        return qkv, z.view(B, T, HV, dv), b, a

    def _conv(self, mixed, cache):
        """Causal depthwise conv + SiLU over time; mixed [B, T, C]. Fills or advances cache.conv_state
        [B, C, K-1] (the last K-1 pre-conv inputs)."""
        w = self.conv1d.weight  # [C, 1, K]
        if cache is not None and not cache.empty:
            state = cache.conv_state
            if state.dtype not in (mixed.dtype, torch.float32):
                state = state.to(mixed.dtype)
            cache.conv_state = state
            return causal_conv1d_update(mixed, state, w, None, "silu")
        y, final = causal_conv1d_fn(mixed, w, None, None, cache is not None, "silu")
        if cache is not None:
            cache.conv_state = final
        return y

    def _decode_fused(self, x, cache):
        """The decode step as one library call (gated_delta_net_decode), or None where it does not
        apply: Qwen3.5 projections on library Linears without bias, no backward, one token a
        sequence, the cache's states in the forms the op updates in place."""
        if _DECODE is None or self.variant != "qwen3_5" or x.shape[1] != 1 or torch.is_grad_enabled():
            return None
        projs = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        conv_state, state = cache.conv_state, cache.recurrent_state
        if (not _one_product(projs + (self.out_proj,)) or x.dtype != self.out_proj.weight.dtype
                or state.dtype != torch.float32 or not state.is_contiguous() or not conv_state.is_contiguous()
                or conv_state.dtype not in (x.dtype, torch.float32)):
            return None
        return _DECODE(x, packed_group(projs), packed_weight(self.out_proj), self.conv1d.weight, self.A_log.float(),
                       self.dt_bias.float(), self.norm.weight, conv_state, state, self.num_k_heads, self.num_v_heads,
                       self.head_k_dim, self.head_v_dim, self.norm.eps)

    def forward(self, hidden_states, cache=None):
        B, T, _ = hidden_states.shape
        HK, HV, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        if cache is not None and not cache.empty:
            y = self._decode_fused(hidden_states, cache)
            if y is not None:
                return y
        mixed, z, b, a = self._project(hidden_states)
        decode = cache is not None and not cache.empty
        mixed = self._conv(mixed, cache)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k, v = q.reshape(B, T, HK, dk), k.reshape(B, T, HK, dk), v.reshape(B, T, HV, dv)
        if decode:  # gates fused into the recurrent kernel
            o, state = fused_recurrent_gated_delta_rule(
                q, k, v, a.float(), b.float(), initial_state=cache.recurrent_state, output_final_state=True,
                use_qk_l2norm_in_kernel=True, A_log=self.A_log.float(), dt_bias=self.dt_bias.float(), beta_sigmoid=True)
        else:
            beta = b.float().sigmoid()
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
            o, state = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=cache is not None,
                                              use_qk_l2norm_in_kernel=True)
        if cache is not None:
            cache.recurrent_state = state
        o = self.norm(o.to(hidden_states.dtype), z)
        return self.out_proj(o.reshape(B, T, self.value_dim))


class _GatedRMSNorm(nn.Module):
    """HF Qwen3NextRMSNormGated: weight * (x / sqrt(mean(x^2) + eps)) * silu(z), in fp32 and rounded
    once (HF rounds the normalised x to x's dtype before the weight and gate)."""

    def __init__(self, dim, eps, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x, z):
        return rms_norm_gated(x, z, self.weight, self.eps)
