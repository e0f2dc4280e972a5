"""Functional wrappers of the matrix engine."""
from ._lib import ops

__all__ = ["matmul"]


def matmul(a, b, alpha=1.0, out_dtype=None):
    """alpha * a @ b with fp32 accumulation; a, b 2-D float32/bfloat16/float16 (strided allowed)."""
    return ops.matmul(a, b, alpha=alpha, out_dtype=out_dtype)
