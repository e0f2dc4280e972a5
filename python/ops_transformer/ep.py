"""Expert parallelism over MPI: torch_npu's npu_moe_distribute_dispatch_v2 / combine_v2 on the
library's MPI dispatcher (include/ot/ep.h), and the pipelined ep_moe_ffn.

Run one process per rank under mpirun (`mpirun -np 2 /usr/bin/python3 train.py`):

    from ops_transformer import ep
    group = ep.EpComm(num_experts)                # MPI_COMM_WORLD (MPI initialised here if needed)
    expand_x, _, assist, counts, recv, _, _ = ep.moe_distribute_dispatch_v2(
        x, expert_ids, group, group.ep_world_size(), group.ep_rank_id(), num_experts, expert_scales=w)
    ...local experts on expand_x (counts = the grouped matmul's group_list, type 1)...
    y = ep.moe_distribute_combine_v2(expert_out, expert_ids, assist, recv, w, group,
                                     group.ep_world_size(), group.ep_rank_id(), num_experts)

The communicator: MPI_COMM_WORLD by default; MPI is initialised on first use by the extension
itself (MPI_Init_thread, FUNNELED) and finalised at interpreter exit, so no Python MPI package is
needed. A caller that owns MPI through mpi4py passes its communicator instead (comm=MPI.COMM_WORLD
or a split): then mpi4py initialises and finalises MPI and the extension only uses it.
AVAILABLE is False when the library was built without MPI (then nothing here can be called)."""
import atexit

import torch

from ._lib import has_op, ops

__all__ = ["AVAILABLE", "EpComm", "init", "moe_distribute_dispatch_v2", "moe_distribute_combine_v2",
           "moe_distribute_dispatch", "moe_distribute_combine", "ep_moe_ffn"]

AVAILABLE = has_op("moe_distribute_dispatch")
_state = {"init": None}


def init():
    """Initialises MPI when nobody did (idempotent); returns (world_size, rank) of MPI_COMM_WORLD."""
    if not AVAILABLE:
        raise RuntimeError("ops_transformer.ep: the library was built without MPI (OT_BUILD_MPI=OFF or no OpenMPI)")
    if _state["init"] is None:
        _state["init"] = tuple(ops.ep_init())
        atexit.register(ops.ep_finalize)  # only finalises an MPI the extension initialised itself
    return _state["init"]


def _handle(comm):
    """The C handle of an mpi4py communicator (0: MPI_COMM_WORLD)."""
    if comm is None:
        return 0
    from mpi4py import MPI  # only when the caller passes an mpi4py communicator
    return MPI._handleof(comm)


def EpComm(num_experts, comm=None, *, threads=-1, node_window=True, shared_expert_rank_num=0):
    """An expert-parallel group over MPI_COMM_WORLD (or an mpi4py communicator) with contiguous
    expert shards. threads: ot's thread count in this process (-1: the node's cores shared among
    its ranks, unless OT_NUM_THREADS / OMP_NUM_THREADS chose; 0: leave it; > 0: exactly);
    node_window: ranks on one node exchange rows through shared memory (same on every rank);
    shared_expert_rank_num S > 0: starts with set_shared_expert_ranks(S)'s placement, so
    num_experts need only be a multiple of W - S (spec 9.1), not of W.
    Methods: ep_world_size(), ep_rank_id(), num_local_experts(), local_experts(),
    rebalance(load, extra_per_rank), set_shared_expert_ranks(S) (ranks [0, S) hold the shared
    expert, id num_experts; 0 restores contiguous shards), last_bytes_sent(), node_size(),
    threads_per_rank(), node_window(). Every rank must create it (collective) and set the same
    placement."""
    if comm is None:
        init()
    return torch.classes.ops_transformer.EpComm(num_experts, _handle(comm), threads, node_window, shared_expert_rank_num)


def moe_distribute_dispatch_v2(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
                               x_active_mask=None, expert_scales=None, shared_expert_num=1, shared_expert_rank_num=0,
                               quant_mode=0, expert_token_nums_type=1, comm_alg="", zero_expert_num=0, copy_expert_num=0,
                               const_expert_num=0, dedup_combine=True, comm_quant_mode=0):
    """torch_npu.npu_moe_distribute_dispatch_v2 -> (expand_x, dynamic_scales, assist_info_for_combine,
    expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales). Rows of expand_x are ordered
    local expert, source rank, token; a token goes once to each destination rank (dedup).
    comm_alg "" / "all_to_all" or "all_gather"; quant_mode 2 = dynamic per-row int8; scales: fp32
    [shared_expert_num + moe_expert_num, H] smooth-quant scales for quant_mode 2 (routed expert e
    uses row e + shared_expert_num; each row is then quantised per (token, expert)); x_active_mask
    [BS] or [BS, K] bool: inactive tokens / slots are not sent (an inactive token's combined row is 0).
    zero/copy/const_expert_num: ids past moe_expert_num name special experts (spec 9.3), never sent,
    computed at combine (pass ori_x and the const experts' parameters there).
    shared_expert_rank_num S: with group_ep.set_shared_expert_ranks(S), every token also goes to one
    of the shared-expert ranks [0, S) and comes back unweighted.
    Library options (not torch_npu's): dedup_combine=False returns one row per (token, expert) and
    sums in k order at the source (fp32 bit-identical to a single process); comm_quant_mode=2 sends
    the combine rows as int8 with a per-row scale (combine must pass the same value)."""
    return ops.moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales=scales,
                                       x_active_mask=x_active_mask, expert_scales=expert_scales,
                                       shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
                                       quant_mode=quant_mode, expert_token_nums_type=expert_token_nums_type, comm_alg=comm_alg,
                                       zero_expert_num=zero_expert_num, copy_expert_num=copy_expert_num,
                                       const_expert_num=const_expert_num, dedup_combine=dedup_combine,
                                       comm_quant_mode=comm_quant_mode)


def moe_distribute_combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                              ep_world_size, ep_rank_id, moe_expert_num, *, shared_expert_x=None, ori_x=None,
                              const_expert_alpha_1=None, const_expert_alpha_2=None, const_expert_v=None,
                              shared_expert_num=1, shared_expert_rank_num=0, comm_quant_mode=0, zero_expert_num=0,
                              copy_expert_num=0, const_expert_num=0):
    """torch_npu.npu_moe_distribute_combine_v2 -> x_out [BS, H] = sum_k scale * expert output
    (+ shared_expert_x, unweighted). expand_x: the expert outputs of the dispatched rows, in their order.
    Special experts: copy experts output ori_x [BS, H], const expert c outputs
    const_expert_alpha_1[c] * ori_x + const_expert_alpha_2[c] * const_expert_v[c] ([C], [C], [C, H]).
    The attributes (shared_expert_*, comm_quant_mode, *_expert_num) must be the dispatch's."""
    return ops.moe_distribute_combine(expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales,
                                      group_ep, ep_world_size, ep_rank_id, moe_expert_num, shared_expert_x=shared_expert_x,
                                      ori_x=ori_x, const_expert_alpha_1=const_expert_alpha_1,
                                      const_expert_alpha_2=const_expert_alpha_2, const_expert_v=const_expert_v,
                                      shared_expert_num=shared_expert_num, shared_expert_rank_num=shared_expert_rank_num,
                                      comm_quant_mode=comm_quant_mode, zero_expert_num=zero_expert_num,
                                      copy_expert_num=copy_expert_num, const_expert_num=const_expert_num)


moe_distribute_dispatch = moe_distribute_dispatch_v2
moe_distribute_combine = moe_distribute_combine_v2


def ep_moe_ffn(x, expert_ids, expert_scales, group_ep, experts, moe_expert_num, *, comm_alg="", chunks=2, quant_mode=0,
               shared_expert_x=None, x_active_mask=None, scales=None, shared_expert_num=1, shared_expert_rank_num=0,
               dedup_combine=True, comm_quant_mode=0, zero_expert_num=0, copy_expert_num=0, const_expert_num=0,
               const_expert_alpha_1=None, const_expert_alpha_2=None, const_expert_v=None):
    """dispatch -> this rank's experts (a MoeExperts holding its local experts in placement order) ->
    combine, pipelined over `chunks` token chunks (communication of one overlaps compute of the previous).
    The options are dispatch's and combine's (x is the copy / const experts' input)."""
    return ops.ep_moe_ffn(x, expert_ids, expert_scales, group_ep, experts, moe_expert_num, comm_alg=comm_alg,
                          chunks=chunks, quant_mode=quant_mode, shared_expert_x=shared_expert_x,
                          x_active_mask=x_active_mask, scales=scales, shared_expert_num=shared_expert_num,
                          shared_expert_rank_num=shared_expert_rank_num, dedup_combine=dedup_combine,
                          comm_quant_mode=comm_quant_mode, zero_expert_num=zero_expert_num,
                          copy_expert_num=copy_expert_num, const_expert_num=const_expert_num,
                          const_expert_alpha_1=const_expert_alpha_1, const_expert_alpha_2=const_expert_alpha_2,
                          const_expert_v=const_expert_v)
