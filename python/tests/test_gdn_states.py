"""GDN state dtypes: initial states in fp32 / bf16 / fp16 (read as fp32), the final state in fp32 or
the dtype asked for, and the recurrent state cache in fp32 or bf16, against the float64 recurrence."""
import pytest
import torch

from conftest import need, rel_err
from gdn_reference import l2n, recurrence

pytestmark = need("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "recurrent_gated_delta_rule")
from ops_transformer import gdn


def inputs(B, T, HK, HV, D, dtype=torch.float32):
    q = torch.randn(B, T, HK, D).to(dtype)
    k = l2n(torch.randn(B, T, HK, D)).to(dtype)
    v = torch.randn(B, T, HV, D).to(dtype)
    g = torch.empty(B, T, HV).uniform_(-1, 0)
    beta = torch.rand(B, T, HV)
    return q, k, v, g, beta


@pytest.mark.parametrize("h0_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16, torch.float16])
def test_chunk_and_recurrent_state_dtypes(h0_dtype, out_dtype):
    q, k, v, g, beta = inputs(2, 70, 1, 2, 32)
    h0 = (torch.randn(2, 2, 32, 32) * 0.5).to(h0_dtype)
    ro, rfinal = recurrence(q, k, v, g, beta, initial_state=h0.float())
    for fn in (gdn.chunk_gated_delta_rule, gdn.fused_recurrent_gated_delta_rule):
        o, final = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, final_state_dtype=out_dtype)
        assert final.dtype == (out_dtype or torch.float32)
        assert rel_err(o, ro) < 2e-5
        assert rel_err(final, rfinal) < (2e-5 if out_dtype is None else 4e-3)
        # The same as the fp32 widening of the initial state, rounded once at the end.
        o32, f32 = fn(q, k, v, g, beta, initial_state=h0.float(), output_final_state=True)
        assert torch.equal(o, o32) and torch.equal(final, f32.to(final.dtype))


def test_chunk_state_dtype_gradients():
    q, k, v, g, beta = inputs(1, 40, 1, 2, 16)
    h0 = (torch.randn(1, 2, 16, 16) * 0.5).to(torch.float16).requires_grad_()
    o, final = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          final_state_dtype=torch.bfloat16)
    (o.sum() + final.float().sum()).backward()
    assert h0.grad.dtype == torch.float16
    h = h0.detach().float().requires_grad_()
    o2, f2 = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h, output_final_state=True)
    (o2.sum() + f2.to(torch.bfloat16).float().sum()).backward()
    assert torch.allclose(h0.grad.float(), h.grad.half().float())


def test_bad_state_dtypes_name_the_argument():
    q, k, v, g, beta = inputs(1, 8, 1, 1, 16)
    with pytest.raises(Exception, match="initial_state"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(1, 1, 16, 16, dtype=torch.int32))
    with pytest.raises(Exception, match="final_state_dtype"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, final_state_dtype=torch.int32)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_recurrent_state_cache(cache_dtype):
    """Decode on a cache of 4 slots: the step computes in fp32; an fp32 cache ends at fp32
    rounding, a bf16 cache is rounded once per write (2^-9 relative)."""
    q, k, v, g, beta = inputs(2, 3, 2, 4, 32)
    cache = (torch.randn(4, 4, 32, 32) * 0.5).to(cache_dtype)
    idx = torch.tensor([1, 3], dtype=torch.int32)
    h0 = cache[idx.long()].float()
    ro, rfinal = recurrence(q, k, v, g, beta, initial_state=h0, l2norm=True)
    untouched = cache[[0, 2]].clone()
    o = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, cache, idx, use_qk_l2norm_in_kernel=True)
    assert cache.dtype == cache_dtype and torch.equal(cache[[0, 2]], untouched)
    assert rel_err(o, ro) < 2e-5
    assert rel_err(cache[idx.long()], rfinal) < (2e-5 if cache_dtype == torch.float32 else 4e-3)
