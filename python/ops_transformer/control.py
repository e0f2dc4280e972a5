"""Run-time path controls (the same switches as OT_MAX_ISA / OT_FORCE_REF), as context managers."""
import contextlib

from ._lib import ops

ISA = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3, "amx": 4}


@contextlib.contextmanager
def force_ref(on=True):
    """Route every operator to its plain reference inside the block."""
    _, prev = ops.isa_state()
    ops.set_force_ref(on)
    try:
        yield
    finally:
        ops.set_force_ref(prev)


@contextlib.contextmanager
def max_isa(name):
    """Cap the instruction set the dispatchers may use inside the block (e.g. "avx2", "scalar")."""
    prev, _ = ops.isa_state()
    ops.set_max_isa(ISA[name])
    try:
        yield
    finally:
        ops.set_max_isa(prev)
