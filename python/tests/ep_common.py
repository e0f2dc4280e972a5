"""Helpers of the mpirun EP workers (ep_worker.py, ep_options_worker.py): plain-PyTorch experts and
the run wrapper that reports a rank's failure before it exits."""
import sys

import torch


def rel(got, want):
    """||got - want|| / ||want|| in float64."""
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


def ffn(rows, g, u, d, e):
    """Plain SwiGLU expert e on rows [n, H]: g, u [E, I, H], d [E, H, I]."""
    return (torch.nn.functional.silu(rows @ g[e].t()) * (rows @ u[e].t())) @ d[e].t()


def local_outputs(expand_x, counts, local, g, u, d, dyn=None):
    """This rank's experts (global ids `local`) on the dispatched rows, in their order; int8 rows
    are dequantised with their dynamic scales `dyn`."""
    rows = expand_x.float() * dyn[:, None] if dyn is not None else expand_x
    outs, off = [torch.zeros(0, rows.shape[1])], 0
    for l, n in enumerate(counts.tolist()):
        outs.append(ffn(rows[off:off + n], g, u, d, local[l]))
        off += n
    assert off == rows.shape[0], (off, rows.shape)
    return torch.cat(outs)


def run(main):
    """Runs a worker's main; a failing rank says so (mpirun then stops the others)."""
    try:
        main()
    except Exception as exc:
        print(f"EP-FAIL {exc!r}", flush=True)
        sys.stdout.flush()
        raise
