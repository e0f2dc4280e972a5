"""Run by test_ep.py under `mpirun -np N`: dispatch + local experts + combine, the pipelined
ep_moe_ffn (both dispatchers) and a bad argument on one rank, each rank checking its tokens against
the single-process moe_ffn on the same weights. Prints "EP-OK rank r" on success."""
import math

import torch

from ep_common import local_outputs, rel, run
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
    local = group.local_experts()
    local_store = moe.MoeExperts(g[local], u[local], d[local])

    for alg in ("", "all_gather"):
        ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                          comm_alg=alg)
        y = ep.moe_distribute_combine_v2(local_outputs(ex, counts, local, g, u, d), ids, assist, recv, w, group, W, r, E)
        assert rel(y, y_ref) < 1e-5, f"rank {r} dispatch/combine {alg!r}: rel err {rel(y, y_ref)}"
        y2 = ep.ep_moe_ffn(x, ids, w, group, local_store, E, comm_alg=alg, chunks=2)
        assert rel(y2, y_ref) < 1e-5, f"rank {r} ep_moe_ffn {alg!r}: rel err {rel(y2, y_ref)}"

    mask = torch.arange(BS) < BS - 2  # 1-D mask: the last two tokens inactive (x_out rows 0)
    ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                      x_active_mask=mask)
    y = ep.moe_distribute_combine_v2(local_outputs(ex, counts, local, g, u, d), ids, assist, recv, w, group, W, r, E)
    want = torch.where(mask[:, None], y_ref, torch.zeros_like(y_ref))
    assert rel(y, want) < 1e-5, f"rank {r}: x_active_mask"
    y2 = ep.ep_moe_ffn(x, ids, w, group, local_store, E, x_active_mask=mask)
    assert rel(y2, want) < 1e-5, f"rank {r}: ep_moe_ffn x_active_mask"

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
    run(main)
