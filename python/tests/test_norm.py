"""rms_norm / add_rms_norm (torch_npu's npu_rms_norm / npu_add_rms_norm) against an fp64 torch
RMSNorm: forward, gradients through autograd (including x_sum's other uses), the fused form against
the two calls bit for bit, the module, bad inputs."""
import pytest
import torch

from conftest import need, rel_err
from ops_transformer import layers

pytestmark = need("rms_norm", "add_rms_norm", "rms_norm_backward")


def torch_rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 64), (5, 37), (1, 1000), (0, 16)])
def test_rms_norm_forward_and_gradients(dtype, shape):
    torch.manual_seed(0)
    x, dy = torch.randn(*shape).to(dtype), torch.randn(*shape).to(dtype)
    w = (torch.rand(shape[-1]) + 0.5).to(dtype)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = layers.rms_norm(xg, wg, eps=1e-6)
    (y.float() * dy.float()).sum().backward()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ry = torch_rms(xr, wr, 1e-6)
    (ry * dy.double()).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    assert y.dtype == dtype and y.shape == x.shape and rel_err(y, ry) < tol
    assert xg.grad.dtype == dtype and rel_err(xg.grad, xr.grad) < tol
    assert wg.grad.dtype == dtype and rel_err(wg.grad, wr.grad) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_is_the_two_calls_and_differentiates_both_outputs(dtype):
    torch.manual_seed(1)
    x, r = torch.randn(6, 9, 48).to(dtype), torch.randn(6, 9, 48).to(dtype)
    w = (torch.rand(48) + 0.5).to(dtype)
    y, s = layers.add_rms_norm(x, r, w)
    assert torch.equal(s, x + r)
    assert torch.equal(y, layers.rms_norm(x + r, w))
    # loss uses both y and x_sum (the residual stream goes on past the norm)
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    args = [t.clone().requires_grad_() for t in (x, r, w)]
    y, s = layers.add_rms_norm(*args)
    ((y.float() * gy.float()).sum() + (s.float() * gs.float()).sum()).backward()
    ref = [t.double().requires_grad_() for t in (x, r, w)]
    rs = ref[0] + ref[1]
    ((torch_rms(rs, ref[2], 1e-6) * gy.double()).sum() + (rs * gs.double()).sum()).backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want, name in zip(args, ref, ("x", "residual", "weight")):
        assert rel_err(got.grad, want.grad) < tol, name


def test_module_matches_hf_formula_and_fuses_the_residual():
    norm = layers.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, r = torch.randn(5, 32), torch.randn(5, 32)
    assert rel_err(norm(x), torch_rms(x, norm.weight, 1e-6)) < 1e-6
    y, s = norm(x, r)
    assert torch.equal(s, x + r) and torch.equal(y, norm(x + r))
    assert list(norm.state_dict()) == ["weight"]


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="'weight'"):
        layers.rms_norm(x, torch.ones(15))
    with pytest.raises(RuntimeError, match="'x2'"):
        layers.add_rms_norm(x, torch.randn(3, 16), torch.ones(16))
    with pytest.raises(RuntimeError, match="'x'"):
        layers.rms_norm(torch.ones(4, 16, dtype=torch.int32), torch.ones(16))
