"""Run by test_ep.py under `mpirun -np N`: dispatch + local experts + combine, the pipelined
ep_moe_ffn (both dispatchers) and a bad argument on one rank, each rank checking its tokens against
the single-process moe_ffn on the same weights. Prints "EP-OK rank r" on success."""
import math
import sys

import torch

import ops_transformer as ot
from ops_transformer import ep, moe


def main():
    torch.manual_seed(0)  # same weights on every rank
    E, H, I, K = 8, 64, 32, 2
    R = torch.randn(E, H) / 8
    g, u = torch.randn(E, I, H) / 8, torch.randn(E, I, H) / 8
    d = torch.randn(E, H, I) / math.sqrt(I)
    group = ep.EpComm(E)
    W, r = group.ep_world_size(), group.ep_rank_id()
    torch.manual_seed(100 + r)
    BS = 5 + 3 * r  # BS differs between ranks
    x = torch.randn(BS, H)
    y_ref, _, ids, w, _, _ = moe.moe_ffn(x, moe.PackedWeight(R), moe.MoeExperts(g, u, d), k=K)

    for alg in ("", "all_gather"):
        ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                          comm_alg=alg)
        local = group.local_experts()
        outs, off = [], 0
        for l, n in enumerate(counts.tolist()):  # this rank's experts, plain PyTorch
            e, rows = local[l], ex[off:off + n]
            outs.append((torch.nn.functional.silu(rows @ g[e].t()) * (rows @ u[e].t())) @ d[e].t())
            off += n
        assert off == ex.shape[0], (off, ex.shape)
        y = ep.moe_distribute_combine_v2(torch.cat(outs) if outs else ex, ids, assist, recv, w, group, W, r, E)
        err = ((y - y_ref).norm() / y_ref.norm()).item()
        assert err < 1e-5, f"rank {r} dispatch/combine {alg!r}: rel err {err}"

        local_store = moe.MoeExperts(g[local], u[local], d[local])
        y2 = ep.ep_moe_ffn(x, ids, w, group, local_store, E, comm_alg=alg, chunks=2)
        err = ((y2 - y_ref).norm() / y_ref.norm()).item()
        assert err < 1e-5, f"rank {r} ep_moe_ffn {alg!r}: rel err {err}"

    mask = torch.arange(BS) < BS - 2  # 1-D mask: the last two tokens inactive (x_out rows 0)
    ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                      x_active_mask=mask)
    outs, off = [], 0
    for l, n in enumerate(counts.tolist()):
        e, rows = local[l], ex[off:off + n]
        outs.append((torch.nn.functional.silu(rows @ g[e].t()) * (rows @ u[e].t())) @ d[e].t())
        off += n
    y = ep.moe_distribute_combine_v2(torch.cat(outs), ids, assist, recv, w, group, W, r, E)
    want = torch.where(mask[:, None], y_ref, torch.zeros_like(y_ref))
    assert ((y - want).norm() / want.norm()).item() < 1e-5, f"rank {r}: x_active_mask"
    y2 = ep.ep_moe_ffn(x, ids, w, group, local_store, E, x_active_mask=mask)
    assert ((y2 - want).norm() / want.norm()).item() < 1e-5, f"rank {r}: ep_moe_ffn x_active_mask"

    bad = ids.clone()
    if r == W - 1:
        bad[0, 0] = E + 3  # out of range on one rank only: every rank must raise, none may hang
    try:
        ep.moe_distribute_dispatch_v2(x, bad, group, W, r, E, expert_scales=w)
        raise AssertionError(f"rank {r}: bad expert id on rank {W - 1} did not raise")
    except RuntimeError as e:
        assert "expert_ids" in str(e), str(e)
    for bad_ids in (ids.long(),):  # int64 ids (every rank)
        try:
            ep.moe_distribute_dispatch_v2(x, bad_ids, group, W, r, E, expert_scales=w)
            raise AssertionError("int64 expert_ids did not raise")
        except RuntimeError as e:
            assert "expert_ids" in str(e), str(e)
    try:
        ep.moe_distribute_dispatch_v2(x, ids, group, W + 1, r, E, expert_scales=w)
        raise AssertionError("ep_world_size mismatch did not raise")
    except RuntimeError as e:
        assert "ep_world_size" in str(e), str(e)
    print(f"EP-OK rank {r}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # a failing rank must not leave the others waiting
        print(f"EP-FAIL {exc!r}", flush=True)
        sys.stdout.flush()
        raise
