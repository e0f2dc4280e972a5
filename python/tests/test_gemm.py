"""The foundation op (matmul through the matrix engine), the bridge and the run-time controls."""
import pytest
import torch

import ops_transformer as ot
from conftest import TOL, rel_err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (7, 33, 5), (130, 96, 70)])
def test_matmul_vs_torch(dtype, m, k, n):
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    want = a.double() @ b.double()
    assert rel_err(ot.matmul(a, b), want) < TOL[dtype] * 2
    assert ot.matmul(a, b).dtype == dtype


def test_matmul_strided_views_no_copy():
    base = torch.randn(40, 50)
    a = base[::2, 3:20]          # row stride 100, not contiguous
    b = torch.randn(30, 17).t()  # transposed: column-major
    out = ot.matmul(a, b, alpha=0.5, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, 0.5 * a.double() @ b.double()) < 1e-2


def test_matmul_zero_rows():
    assert ot.matmul(torch.randn(0, 8), torch.randn(8, 4)).shape == (0, 4)


def test_force_ref_and_max_isa_give_same_result():
    a, b = torch.randn(9, 40), torch.randn(40, 11)
    fast = ot.matmul(a, b)
    with ot.force_ref():
        assert ot.ops.isa_state()[1] is True
        ref = ot.matmul(a, b)
    assert ot.ops.isa_state()[1] is False
    with ot.max_isa("scalar"):
        assert ot.ops.isa_state()[0] == 0
        scalar = ot.matmul(a, b)
    assert rel_err(fast, ref) < 1e-5 and rel_err(scalar, ref) < 1e-5


@pytest.mark.parametrize("a,b,arg", [
    (torch.randn(4, 5), torch.randn(6, 3), "'b'"),                      # inner dims differ
    (torch.randn(4, 5).double(), torch.randn(5, 3), "'a'"),             # float64 not supported
    (torch.randn(2, 4, 5), torch.randn(5, 3), "'a'"),                   # not 2-D
    (torch.randn(4, 5), torch.randint(0, 3, (5, 3), dtype=torch.int32), "'b'"),  # integer matrix
])
def test_matmul_bad_input_names_argument(a, b, arg):
    with pytest.raises(RuntimeError, match=arg):
        ot.matmul(a, b)


def test_bad_out_dtype_and_isa():
    with pytest.raises(RuntimeError, match="'out_dtype'"):
        ot.matmul(torch.randn(2, 2), torch.randn(2, 2), out_dtype=torch.int32)
    with pytest.raises(RuntimeError, match="'isa'"):
        ot.ops.set_max_isa(9)


def test_library_found():
    assert ot.library_path.endswith("libot_torch.so")
