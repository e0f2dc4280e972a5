"""Run by test_ep.py under `mpirun -np N`: the EP options beyond the basic pair -- smooth-quant scales,
zero/copy/const experts, dedup_combine / comm_quant_mode, shared-expert ranks -- each rank checking its
tokens against plain PyTorch on the same weights, and bad options on ONE rank raising on every rank
with the argument named. Prints "EP-OK rank r" on success."""
import torch

from ep_common import ffn, local_outputs, rel, run
from ops_transformer import ep, moe

H, I, K = 64, 32, 3
E = 0  # routed experts: 4 per rank (set in main)
Z, C, Q = 1, 1, 1  # zero, copy and const experts: ids E, E + 1, E + 2


def rank_inputs(r, n_ids):
    """x [BS, H], expert_ids [BS, K] (distinct, from range(n_ids)), expert_scales [BS, K] of rank r,
    the same on every rank."""
    gen = torch.Generator().manual_seed(100 + r)
    bs = 4 + 3 * r
    x = torch.randn(bs, H, generator=gen)
    ids = torch.stack([torch.randperm(n_ids, generator=gen)[:K] for _ in range(bs)]).int()
    w = torch.rand(bs, K, generator=gen) + 0.1
    return x, ids, w


def reference(x, ids, w, g, u, d, special=None):
    """sum_k w * expert output; ids >= E go to special(c, x_t) when given."""
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(K):
            e = int(ids[t, k])
            out = ffn(x[t:t + 1], g, u, d, e)[0] if e < E else special(e - E, x[t])
            y[t] += w[t, k] * out
    return y


def expect_error(arg, fn, got=None):
    try:
        fn()
    except RuntimeError as e:
        assert f"'{arg}'" in str(e), f"expected an error naming {arg!r}: {e}"
        assert got is None or f", got {got}" in str(e), f"expected an error saying it got {got!r}: {e}"
        return
    raise AssertionError(f"rank {ep.init()[1]}: no error naming {arg!r}")


def main():
    global E
    E = 4 * ep.init()[0]
    torch.manual_seed(0)  # same weights on every rank
    g, u, d = torch.randn(E, I, H) / 8, torch.randn(E, I, H) / 8, torch.randn(E, H, I) / 8
    group = ep.EpComm(E)
    W, r = group.ep_world_size(), group.ep_rank_id()
    local = group.local_experts()
    store = moe.MoeExperts(g[local], u[local], d[local])
    x, ids, w = rank_inputs(r, E)
    y_ref = reference(x, ids, w, g, u, d)

    # 1. Smooth-quant scales: row (token t, expert e) = int8(x[t] * scales[e + shared_expert_num]) with
    # its own scale; end to end with weights divided by the scales (what smooth quant assumes).
    scales = torch.rand(E + 1, H, generator=torch.Generator().manual_seed(7)) * 2 + 0.25
    every = [rank_inputs(q, E) for q in range(W)]
    for alg in ("", "all_gather"):
        ex, dyn, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(
            x, ids, group, W, r, E, expert_scales=w, quant_mode=2, scales=scales, comm_alg=alg)
        assert ex.dtype == torch.int8 and dyn.shape == (ex.shape[0],)
        for i, (src, t, k) in enumerate(assist.view(-1, 3)[:ex.shape[0]].tolist()):
            xs = every[src][0][t] * scales[int(every[src][1][t, k]) + 1]
            assert abs(dyn[i].item() - xs.abs().max().item() / 127) <= 1e-6 * dyn[i].item() + 1e-12, (alg, i)
            assert (ex[i].float() * dyn[i] - xs).abs().max().item() <= 0.5001 * dyn[i].item(), (alg, i)
        ep.moe_distribute_combine_v2(torch.zeros(ex.shape[0], H), ids, assist, recv, w, group, W, r, E)
    s = scales[1:][local][:, None, :]  # [L, 1, H]: columns of the gate/up weights
    smooth_store = moe.MoeExperts(g[local] / s, u[local] / s, d[local])
    for dedup in (True, False):
        y = ep.ep_moe_ffn(x, ids, w, group, smooth_store, E, quant_mode=2, scales=scales, dedup_combine=dedup)
        assert rel(y, y_ref) < 3e-2, f"rank {r} smooth-quant ep_moe_ffn dedup={dedup}: {rel(y, y_ref)}"

    # 2. Zero, copy and const experts: never sent, computed at combine from ori_x and the parameters.
    a1, a2, v = torch.tensor([0.5]), torch.tensor([-1.5]), torch.randn(Q, H)
    special = lambda c, xt: [torch.zeros(H), xt, a1[0] * xt + a2[0] * v[0]][c]
    xs_, ids_s, w_s = rank_inputs(r, E + Z + C + Q)
    y_s = reference(xs_, ids_s, w_s, g, u, d, special)
    nums = dict(zero_expert_num=Z, copy_expert_num=C, const_expert_num=Q)
    consts = dict(const_expert_alpha_1=a1, const_expert_alpha_2=a2, const_expert_v=v)
    for alg in ("", "all_gather"):
        for dedup in (True, False):
            ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(
                xs_, ids_s, group, W, r, E, expert_scales=w_s, comm_alg=alg, dedup_combine=dedup, **nums)
            out = local_outputs(ex, counts, local, g, u, d)
            y = ep.moe_distribute_combine_v2(out, ids_s, assist, recv, w_s, group, W, r, E, ori_x=xs_, **consts, **nums)
            assert rel(y, y_s) < 1e-5, f"rank {r} special experts {alg!r} dedup={dedup}: {rel(y, y_s)}"
    y = ep.ep_moe_ffn(xs_, ids_s, w_s, group, store, E, **nums, **consts)
    assert rel(y, y_s) < 1e-5, f"rank {r} special experts ep_moe_ffn: {rel(y, y_s)}"

    # 3. Per-slot combine (dedup_combine=False) and int8 combine rows (comm_quant_mode=2).
    for dedup in (True, False):
        for cq, tol in ((0, 1e-5), (2, 3e-2)):
            ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(
                x, ids, group, W, r, E, expert_scales=w, dedup_combine=dedup, comm_quant_mode=cq)
            out = local_outputs(ex, counts, local, g, u, d)
            y = ep.moe_distribute_combine_v2(out, ids, assist, recv, w, group, W, r, E, comm_quant_mode=cq)
            assert rel(y, y_ref) < tol, f"rank {r} dedup={dedup} comm_quant_mode={cq}: {rel(y, y_ref)}"
            y = ep.ep_moe_ffn(x, ids, w, group, store, E, dedup_combine=dedup, comm_quant_mode=cq)
            assert rel(y, y_ref) < tol, f"rank {r} ep_moe_ffn dedup={dedup} comm_quant_mode={cq}: {rel(y, y_ref)}"

    # 4. Shared-expert ranks: rank 0 holds the shared expert (weights E), added unweighted.
    if W > 1:
        # Routed experts on ranks [1, W): E2 a multiple of W - 1 but (W = 2, 3) not of W (spec 9.1);
        # expert E2 = the shared one.
        E2 = (W - 1) * -(-K // (W - 1))
        shared = ep.EpComm(E2, shared_expert_rank_num=1)
        if E2 % W:  # contiguous shards need a multiple of W: both ways of asking for them raise
            expect_error("num_experts", lambda: ep.EpComm(E2))
            expect_error("num_experts", lambda: shared.set_shared_expert_ranks(0))
        loc2 = shared.local_experts()
        assert (loc2 == [E2]) if r == 0 else all(e < E2 for e in loc2), loc2
        gen = torch.Generator().manual_seed(1)
        g2, u2, d2 = (torch.randn(E2 + 1, *shape, generator=gen) / 8 for shape in ((I, H), (I, H), (H, I)))
        x2, ids2, w2 = rank_inputs(r, E2)
        want = sum(w2[:, k:k + 1] * torch.cat([ffn(x2[t:t + 1], g2, u2, d2, int(ids2[t, k])) for t in range(x2.shape[0])])
                   for k in range(K)) + ffn(x2, g2, u2, d2, E2)
        ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(x2, ids2, shared, W, r, E2, expert_scales=w2,
                                                                          shared_expert_rank_num=1)
        out = local_outputs(ex, counts, loc2, g2, u2, d2)
        y = ep.moe_distribute_combine_v2(out, ids2, assist, recv, w2, shared, W, r, E2, shared_expert_rank_num=1)
        assert rel(y, want) < 1e-5, f"rank {r} shared-expert ranks: {rel(y, want)}"
        y = ep.ep_moe_ffn(x2, ids2, w2, shared, moe.MoeExperts(g2[loc2], u2[loc2], d2[loc2]), E2, shared_expert_rank_num=1)
        assert rel(y, want) < 1e-5, f"rank {r} shared-expert ranks ep_moe_ffn: {rel(y, want)}"

    # 5. Communicator options: messages only (no node window), ot's thread count left alone.
    plain = ep.EpComm(E, threads=0, node_window=False)
    assert not plain.node_window() and plain.node_size() == W, (plain.node_window(), plain.node_size())
    for dedup in (True, False):
        y = ep.ep_moe_ffn(x, ids, w, plain, store, E, dedup_combine=dedup)
        assert rel(y, y_ref) < 1e-5, f"rank {r} without the node window dedup={dedup}: {rel(y, y_ref)}"

    # 6. A bad option on the last rank only: every rank raises, naming it; nobody is left waiting.
    last = r == W - 1
    expect_error("scales", lambda: ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                 scales=scales if last else None))  # without quant_mode 2
    expect_error("scales", lambda: ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w, quant_mode=2,
                                                                 scales=scales[1:] if last else scales),
                 got=f"rank {W - 1}: {E}")  # the library's smooth_scales error, renamed with its parts
    expect_error("quant_mode", lambda: ep.moe_distribute_dispatch_v2(x, ids, group, W, r, E, expert_scales=w,
                                                                     quant_mode=1 if last else 0))
    expect_error("comm_alg", lambda: ep.ep_moe_ffn(x, ids, w, group, store, E, comm_alg="ring" if last else ""))
    expect_error("shared_expert_num", lambda: ep.ep_moe_ffn(x, ids, w, group, store, E, shared_expert_num=-1 if last else 1))
    ex, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(xs_, ids_s, group, W, r, E, expert_scales=w_s, **nums)
    out = local_outputs(ex, counts, local, g, u, d)
    combine = lambda **kw: ep.moe_distribute_combine_v2(out, ids_s, assist, recv, w_s, group, W, r, E, **kw)
    expect_error("zero_expert_num", lambda: combine(ori_x=xs_, **consts, **dict(nums, zero_expert_num=Z + last)))
    expect_error("ep_world_size", lambda: ep.moe_distribute_combine_v2(out, ids_s, assist, recv, w_s, group, W + last, r, E,
                                                                       ori_x=xs_, **consts, **nums))
    expect_error("ori_x", lambda: combine(ori_x=None if last else xs_, **consts, **nums))
    expect_error("expand_x", lambda: combine(ori_x=xs_, **consts, **nums) if not last else
                 ep.moe_distribute_combine_v2(out[:-1] if out.shape[0] else torch.zeros(1, H), ids_s, assist, recv, w_s,
                                              group, W, r, E, ori_x=xs_, **consts, **nums))
    y = ep.ep_moe_ffn(x, ids, w, group, store, E)  # a good call completes everywhere
    assert rel(y, y_ref) < 1e-5
    print(f"EP-OK rank {r}", flush=True)


if __name__ == "__main__":
    run(main)
