// Plain fp64 rotate-half rotary embedding (ot/rotary.h), element by element.
#include "ot/rotary.h"

namespace ot::ref {

void rotary_mul(const TensorView& x, const TensorView& cos, const TensorView& sin, double sign, const TensorView& y) {
  const int64_t R = x.sizes[0], T = x.sizes[1], D = x.sizes[2], h = D / 2;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D; ++i) {
        auto at = [&](const TensorView& v, int64_t j) { return get_as_double(v, (r * T + t) * D + j); };
        const double rot = i < h ? -at(x, i + h) : at(x, i - h);
        const double c = get_as_double(cos, t * D + i), s = sign * get_as_double(sin, t * D + i);
        set_from_double(y, (r * T + t) * D + i, at(x, i) * c + rot * s);
      }
}

}  // namespace ot::ref
