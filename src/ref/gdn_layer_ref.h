// Plain fp64 references of the GDN layer operators of ot/gdn_layer.h (causal_conv1d_ref.cpp,
// rms_norm_gated_ref.cpp): the OT_FORCE_REF path and the ground truth of the tests. They take the
// operator's already validated arguments in canonical views and write outputs the caller allocated.
// Only ot/* and src/core/* headers: the references share no code with the fast paths.
#pragma once
#include <cstdint>
#include <vector>

#include "ot/gdn_layer.h"
#include "ot/tensor.h"

namespace ot::gdn::ref {

// x, y [B, T, D]; weight [D, W]; bias [D] or undefined; init, fin [N, D, W-1] or undefined.
// seq_starts: varlen token offsets [N+1] (B == 1), or empty: each batch row is one sequence.
void causal_conv1d_fwd(const TensorView& x, const TensorView& weight, const TensorView& bias, const TensorView& init, bool silu,
                       const std::vector<int64_t>& seq_starts, const TensorView& y, const TensorView& fin);
// dy [B, T, D], dfin like fin or undefined; dx like x; dweight [D, W] and dbias [D] (fp32, dbias may
// be undefined); dinit like init or undefined.
void causal_conv1d_bwd(const TensorView& x, const TensorView& weight, const TensorView& bias, const TensorView& init, bool silu,
                       const std::vector<int64_t>& seq_starts, const TensorView& dy, const TensorView& dfin, const TensorView& dx,
                       const TensorView& dweight, const TensorView& dbias, const TensorView& dinit);
// x, y [B, S, D]; state [slots, D, W-1] updated in place; slots: one per row (negative: padded row).
void causal_conv1d_update(const TensorView& x, const TensorView& state, const TensorView& weight, const TensorView& bias, bool silu,
                          const std::vector<int64_t>& slots, const TensorView& y);

// x, z, y [rows, N]; weight [N]; rstd [rows, N / group] fp32 (may be undefined).
void rms_norm_gated(const TensorView& x, const TensorView& z, const TensorView& weight, double eps, bool norm_before_gate,
                    int64_t group, const TensorView& y, const TensorView& rstd);
// dy, x, z, dx, dz [rows, N]; dweight [N] fp32.
void rms_norm_gated_bwd(const TensorView& dy, const TensorView& x, const TensorView& z, const TensorView& weight, double eps,
                        bool norm_before_gate, int64_t group, const TensorView& dx, const TensorView& dz, const TensorView& dweight);

}  // namespace ot::gdn::ref
