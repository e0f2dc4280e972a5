// Plain fp64 references of ot/norm.h (rms_norm_ref.cpp): the OT_FORCE_REF path and the ground
// truth of the tests. Already validated arguments as [rows, N] views; outputs allocated by the
// caller. Only ot/* and src/core/* headers.
#pragma once
#include "ot/tensor.h"

namespace ot::ref {

// x2, x_sum undefined: rms_norm; else x_sum = x + x2 (rounded to its dtype) is normalised.
// rstd [rows] fp32.
void rms_norm(const TensorView& x, const TensorView& x2, const TensorView& weight, double eps, const TensorView& x_sum,
              const TensorView& y, const TensorView& rstd);
// dx [rows, N]; dweight [N] fp32; extra undefined or [rows, N].
void rms_norm_bwd(const TensorView& dy, const TensorView& x, const TensorView& weight, double eps, const TensorView& extra,
                  const TensorView& dx, const TensorView& dweight);

}  // namespace ot::ref
