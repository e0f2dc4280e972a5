"""causal_conv1d_fn / causal_conv1d_update / rms_norm_gated against plain PyTorch (F.conv1d with
groups=channels and left padding, an fp32/fp64 gated RMSNorm): forward, gradients, varlen, the decode
step, bad inputs."""
import pytest
import torch
import torch.nn.functional as F

from conftest import need, rel_err
from ops_transformer import layers

pytestmark = need("causal_conv1d_fn", "causal_conv1d_bwd", "causal_conv1d_update", "rms_norm_gated", "rms_norm_gated_bwd")


def torch_conv(x, w, bias=None, init=None, silu=True):
    """Plain torch: x [B, T, D], w [D, W], init [B, D, W-1] -> (y [B, T, D], final [B, D, W-1])."""
    B, T, D = x.shape
    W = w.shape[1]
    xt = x.transpose(1, 2)
    pre = init.to(x.dtype) if init is not None else x.new_zeros(B, D, W - 1)
    full = torch.cat([pre, xt], dim=2)
    if T == 0:
        return x.clone(), full
    y = F.conv1d(full, w[:, None, :], bias, groups=D)
    if silu:
        y = F.silu(y)
    return y.transpose(1, 2), full[:, :, full.shape[2] - (W - 1):]


def torch_norm(x, z, w, eps, norm_before_gate=True, group=None):
    shape = x.shape
    G = group or shape[-1]
    x, z = x.reshape(-1, shape[-1] // G, G), z.reshape(-1, shape[-1] // G, G)
    if not norm_before_gate:
        x = x * F.silu(z)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.reshape(-1, G)
    if norm_before_gate:
        y = y * F.silu(z)
    return y.reshape(shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("bias,init,silu", [(True, True, True), (False, False, True), (True, False, False)])
def test_conv_forward(dtype, W, bias, init, silu):
    B, T, D = 2, 33, 70
    x = torch.randn(B, T, D).to(dtype)
    w = (torch.randn(D, W) * 0.5).to(dtype)
    b = torch.randn(D).to(dtype) if bias else None
    s0 = torch.randn(B, D, W - 1).to(dtype) if init else None
    y, fin = layers.causal_conv1d_fn(x, w, b, s0, True, "silu" if silu else None)
    ry, rfin = torch_conv(x.double(), w.double(), None if b is None else b.double(), None if s0 is None else s0.double(), silu)
    assert y.dtype == dtype and fin.dtype == dtype
    assert rel_err(y, ry) < {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1.5e-3}[dtype]
    assert torch.equal(fin.double(), rfin)


def test_conv_accepts_nn_conv1d_weight_and_no_final_state():
    x = torch.randn(1, 9, 12)
    conv = torch.nn.Conv1d(12, 12, 4, groups=12, bias=True)
    y, fin = layers.causal_conv1d_fn(x, conv.weight, conv.bias)
    assert fin is None
    ry, _ = torch_conv(x, conv.weight.detach()[:, 0, :], conv.bias.detach())
    assert rel_err(y, ry) < 1e-6


def test_conv_varlen_with_empty_and_one_token_sequences():
    cu = [0, 0, 1, 4, 4, 20]
    D, W = 24, 4
    x = torch.randn(1, cu[-1], D)
    w, s0 = torch.randn(D, W), torch.randn(len(cu) - 1, D, W - 1)
    y, fin = layers.causal_conv1d_fn(x, w, None, s0, True, "silu", torch.tensor(cu, dtype=torch.int32))
    for n in range(len(cu) - 1):
        a, e = cu[n], cu[n + 1]
        ry, rfin = torch_conv(x[:, a:e].double(), w.double(), None, s0[n:n + 1].double())
        if e > a:
            assert rel_err(y[:, a:e], ry) < 1e-6
        assert torch.allclose(fin[n:n + 1].double(), rfin)


@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("cu", [None, [0, 2, 2, 3, 11]])
def test_conv_gradients_match_torch(silu, cu):
    B = 2 if cu is None else 1
    T, D, W = 11, 20, 4
    N = B if cu is None else len(cu) - 1
    x, w, b, s0 = torch.randn(B, T, D), torch.randn(D, W) * 0.5, torch.randn(D), torch.randn(N, D, W - 1)
    dy, dfin = torch.randn(B, T, D), torch.randn(N, D, W - 1)
    args = [t.clone().requires_grad_() for t in (x, w, b, s0)]
    y, fin = layers.causal_conv1d_fn(*args, True, "silu" if silu else None, cu)
    ((y * dy).sum() + (fin * dfin).sum()).backward()
    ref = [t.double().requires_grad_() for t in (x, w, b, s0)]
    loss = 0
    for n in range(N):
        row, a, e = (n, 0, T) if cu is None else (0, cu[n], cu[n + 1])
        ry, rfin = torch_conv(ref[0][row:row + 1, a:e], ref[1], ref[2], ref[3][n:n + 1], silu)
        loss = loss + (ry * dy[row:row + 1, a:e].double()).sum() + (rfin * dfin[n:n + 1].double()).sum()
    loss.backward()
    for got, want, name in zip(args, ref, ("x", "weight", "bias", "initial_states")):
        assert rel_err(got.grad, want.grad) < 1e-5, name


def test_conv_weight_grad_of_nn_conv1d_shape_and_dtype():
    conv = torch.nn.Conv1d(8, 8, 3, groups=8, bias=False).bfloat16()
    x = torch.randn(1, 5, 8).bfloat16().requires_grad_()
    y, _ = layers.causal_conv1d_fn(x, conv.weight)
    y.float().sum().backward()
    assert conv.weight.grad.shape == (8, 1, 3) and conv.weight.grad.dtype == torch.bfloat16
    assert x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_equals_fn_step_by_step(dtype):
    B, T, D, W, slots = 3, 6, 40, 4, 5
    x = torch.randn(B, T, D).to(dtype)
    w, b, s0 = torch.randn(D, W).to(dtype), torch.randn(D).to(dtype), torch.randn(B, D, W - 1).to(dtype)
    y, fin = layers.causal_conv1d_fn(x, w, b, s0, True)
    idx = torch.tensor([4, 0, 2, -1], dtype=torch.int32)  # the last row is padding
    cache = torch.zeros(slots, D, W - 1, dtype=dtype)
    cache[idx[:B].long()] = s0
    before = cache.clone()
    for t in range(T):
        xt = torch.cat([x[:, t], torch.randn(1, D).to(dtype)])
        yt = layers.causal_conv1d_update(xt, cache, w, b, "silu", idx)
        assert rel_err(yt[:B], y[:, t]) < (1e-6 if dtype == torch.float32 else 8e-3)
        assert torch.equal(yt[B], torch.zeros(D, dtype=dtype))
    assert torch.equal(cache[idx[:B].long()], fin)
    assert torch.equal(cache[[1, 3]], before[[1, 3]])


def test_update_several_tokens_without_indices():
    B, S, D, W = 2, 3, 16, 3
    x, w = torch.randn(B, S, D), torch.randn(D, W)
    cache = torch.randn(B, D, W - 1)
    ry, rfin = torch_conv(x, w, None, cache.clone())
    y = layers.causal_conv1d_update(x, cache, w)
    assert rel_err(y, ry) < 1e-6 and torch.equal(cache, rfin)


def test_conv_bad_inputs_name_the_argument():
    x, w = torch.randn(1, 10, 8), torch.randn(8, 4)
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        layers.causal_conv1d_fn(x, w, cu_seqlens=torch.tensor([0, 6, 4, 10]))
    with pytest.raises(RuntimeError, match="cu_seqlens"):
        layers.causal_conv1d_fn(x, w, cu_seqlens=torch.tensor([0.0, 10.0]))
    with pytest.raises(RuntimeError, match="weight"):
        layers.causal_conv1d_fn(x, torch.randn(7, 4))
    with pytest.raises(RuntimeError, match="activation"):
        layers.causal_conv1d_fn(x, w, activation="relu")
    cache = torch.randn(2, 8, 3)
    keep = cache.clone()
    for idx in (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32), torch.tensor([0.0, 1.0])):
        with pytest.raises(RuntimeError, match="conv_state_indices"):
            layers.causal_conv1d_update(torch.randn(2, 8), cache, w, conv_state_indices=idx)
    assert torch.equal(cache, keep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_before_gate,group", [(True, None), (False, None), (True, 16)])
def test_rms_norm_gated_forward_and_gradients(dtype, norm_before_gate, group):
    x, z = torch.randn(3, 7, 4, 64).to(dtype), torch.randn(3, 7, 4, 64).to(dtype)
    w = (torch.rand(64) + 0.5).to(dtype)
    dy = torch.randn(3, 7, 4, 64).to(dtype)
    args = [t.clone().requires_grad_() for t in (x, z, w)]
    y = layers.rms_norm_gated(*args, eps=1e-6, norm_before_gate=norm_before_gate, group_size=group)
    (y.float() * dy.float()).sum().backward()
    ref = [t.double().requires_grad_() for t in (x, z, w)]
    ry = torch_norm(*ref, 1e-6, norm_before_gate, group)
    (ry * dy.double()).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    assert y.dtype == dtype and rel_err(y, ry) < tol
    for got, want, name in zip(args, ref, ("x", "z", "weight")):
        assert got.grad.dtype == dtype
        assert rel_err(got.grad, want.grad) < tol, name


def test_rms_norm_gated_module_matches_hf_formula():
    norm = layers.RMSNormGated(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, z = torch.randn(5, 32), torch.randn(5, 32)
    want = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * F.silu(z)
    assert rel_err(norm(x, z), want) < 1e-6


def test_rms_norm_gated_bad_inputs():
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="'z'"):
        layers.rms_norm_gated(x, torch.randn(4, 15), torch.ones(16))
    with pytest.raises(RuntimeError, match="group_size"):
        layers.rms_norm_gated(x, x, torch.ones(16), group_size=5)


@need("linear_packed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_decode_rows_on_the_packed_weight(dtype):
    """Few rows without a backward run on a weight packed once; an in-place change of the weight
    (an optimizer step, load_state_dict) repacks it; training rows keep the differentiable path."""
    torch.manual_seed(0)
    m = layers.Linear(96, 80, bias=True).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with torch.no_grad():
        for rows in (1, 3, 16, 17):
            x = torch.randn(rows, 96).to(dtype)
            assert rel_err(m(x), F.linear(x, m.weight, m.bias)) < tol
        packed = layers._PACKED_LINEARS[m][1]
        m.weight.mul_(-2.0)
        x = torch.randn(2, 1, 96).to(dtype)
        y = m(x)
        assert y.shape == (2, 1, 80) and rel_err(y, F.linear(x, m.weight, m.bias)) < tol
        assert layers._PACKED_LINEARS[m][1] is not packed
        # the op takes [..., K] with any row strides: a column slice, a transposed stack, no rows
        wide = torch.randn(3, 2, 200).to(dtype)
        for x in (wide[..., 7:103], wide[..., :96].transpose(0, 1), torch.randn(0, 96).to(dtype)):
            y = torch.ops.ops_transformer.linear_packed(x, layers._PACKED_LINEARS[m][1])
            assert y.shape == (*x.shape[:-1], 80) and rel_err(y, F.linear(x, m.weight)) < tol
    x = torch.randn(4, 96).to(dtype).requires_grad_()
    m(x).float().sum().backward()
    assert x.grad is not None and m.weight.grad is not None
    with pytest.raises(RuntimeError, match="x"):
        torch.ops.ops_transformer.linear_packed(torch.randn(2, 95), layers._PACKED_LINEARS[m][1])


@need("bmm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_matches_torch_with_gradients(dtype):
    """layers.bmm over leading dims, strided operands (a transposed view), values and both gradients
    against torch.matmul in fp32; mismatched batch sizes are an error naming b."""
    torch.manual_seed(0)
    a = torch.randn(2, 3, 33, 17).to(dtype).requires_grad_()
    bt = torch.randn(2, 3, 29, 17).to(dtype).requires_grad_()
    c = layers.bmm(a, bt.transpose(-1, -2))
    ref = a.detach().float() @ bt.detach().float().transpose(-1, -2)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert c.dtype == dtype and c.shape == (2, 3, 33, 29) and rel_err(c, ref) < tol
    g = torch.randn(c.shape)
    c.backward(g.to(dtype))
    assert rel_err(a.grad, g @ bt.detach().float()) < tol
    assert rel_err(bt.grad, (a.detach().float().transpose(-1, -2) @ g).transpose(-1, -2)) < tol
    with pytest.raises(RuntimeError, match="b"):
        torch.ops.ops_transformer.bmm(torch.randn(2, 4, 5), torch.randn(3, 5, 6))


@need("linear_packed")
def test_linear_group_is_the_separate_linears():
    """One product for several bias-free Linears: the same outputs (decode rows on the packed
    concatenation, repacked when a weight changes) and each weight's gradient from its slice."""
    torch.manual_seed(3)
    lins = [layers.Linear(48, n, bias=False) for n in (40, 16, 3)]
    with torch.no_grad():
        x = torch.randn(2, 1, 48)
        for got, lin in zip(layers.linear_group(x, lins), lins):
            assert got.shape == (2, 1, lin.out_features) and rel_err(got, F.linear(x, lin.weight)) < 1e-5
        lins[2].weight.mul_(3.0)
        assert rel_err(layers.linear_group(x, lins)[2], F.linear(x, lins[2].weight)) < 1e-5
    x = torch.randn(5, 48, requires_grad=True)
    sum((o * (i + 1)).sum() for i, o in enumerate(layers.linear_group(x, lins))).backward()
    grads = [lin.weight.grad.clone() for lin in lins] + [x.grad.clone()]
    for lin in lins:
        lin.weight.grad = None
    x.grad = None
    sum((F.linear(x, lin.weight) * (i + 1)).sum() for i, lin in enumerate(lins)).backward()
    for got, want in zip(grads, [lin.weight.grad for lin in lins] + [x.grad]):
        assert rel_err(got, want) < 1e-5


@need("rotary_mul", "rotary_mul_backward")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_mul_matches_hf_rotate_half(dtype):
    """x * cos + rotate_half(x) * sin on a transposed [B, H, T, D] view, and dx = the rotation back."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 16).transpose(1, 2).to(dtype).requires_grad_()  # [B, H=3, T=5, D] strided
    ang = torch.rand(5, 8) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    y = layers.rotary_mul(x, cos, sin)
    dy = torch.randn_like(y)
    (y.float() * dy.float()).sum().backward()
    xr = x.detach().double().requires_grad_()
    yr = xr * cos.double() + torch.cat([-xr[..., 8:], xr[..., :8]], -1) * sin.double()
    (yr * dy.double()).sum().backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert y.dtype == dtype and y.shape == x.shape and rel_err(y, yr) < tol
    assert rel_err(x.grad, xr.grad) < tol
    with pytest.raises(RuntimeError, match="'cos'"):
        layers.rotary_mul(x.detach(), cos[:4], sin)
    with pytest.raises(RuntimeError, match="'x'"):
        layers.rotary_mul(torch.randn(2, 5, 15), cos[:, :15], sin[:, :15])


def torch_causal_attention(q, k, v, scale):
    T, S = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ v


@need("causal_attention", "causal_attention_backward")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,S", [(7, 7), (1, 9), (3, 10), (1, 1)])
def test_causal_attention_matches_torch(dtype, T, S):
    """Prefill (T = S), decode (T = 1 on S cached keys), a chunk onto a cache; strided q (a
    transposed [B, T, H, D] projection view); all three gradients against fp64 torch autograd."""
    torch.manual_seed(T * 10 + S)
    q = torch.randn(2, T, 3, 16).to(dtype).transpose(1, 2).requires_grad_()
    k, v = (torch.randn(2, 3, S, 16).to(dtype).requires_grad_() for _ in range(2))
    o = layers.causal_attention(q, k, v, 0.25)
    do = torch.randn_like(o)
    (o.float() * do.float()).sum().backward()
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ro = torch_causal_attention(*ref, 0.25)
    (ro * do.double()).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert o.dtype == dtype and o.shape == (2, 3, T, 16) and rel_err(o, ro) < tol
    for got, want, name in zip((q, k, v), ref, "qkv"):
        if want.grad.abs().max() == 0:  # one key: the softmax is constant, dq is 0 up to rounding
            assert got.grad.abs().max() < 1e-5, name
        else:
            assert rel_err(got.grad, want.grad) < tol, name
    with pytest.raises(RuntimeError, match="'k'"):
        layers.causal_attention(q.detach(), k.detach()[:, :, :T - 1], v.detach(), 0.25)
