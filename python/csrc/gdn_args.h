// Argument conversions shared by the GDN forward and backward bindings: layout strings, optional
// scale, and the Common part (layout, cu_seqlens) of every option struct.
#pragma once
#include <optional>
#include <string>

#include "bridge.h"
#include "ops.h"
#include "ot/gdn.h"

namespace ot::py::gdn_args {

// "BTHD" (fla, time-major, default; also BSND, TND) or "BNSD"/"BHTD"/"NTD" (head-major).
inline gdn::Layout layout_of(c10::string_view s, const char* op) {
  if (s == "BTHD" || s == "BSND" || s == "TND") return gdn::Layout::BTHD;
  if (s == "BHTD" || s == "BNSD" || s == "NTD") return gdn::Layout::BHTD;
  throw ot::Error(op, "layout", "\"BTHD\" (or BSND, TND) or \"BNSD\" (or BHTD, NTD)", std::string(s));
}

inline std::optional<float> opt_float(const c10::optional<double>& d) {
  if (!d) return std::nullopt;
  return float(*d);
}

// Sets the gdn::Common base of any option struct.
template <class O> void set_common(O& c, const char* op, c10::string_view layout, const OptTensor& cu_seqlens) {
  c.layout = layout_of(layout, op);
  c.cu_seqlens = view(cu_seqlens, op, "cu_seqlens");
}
inline gdn::Common common(const char* op, c10::string_view layout, const OptTensor& cu_seqlens) {
  gdn::Common c;
  set_common(c, op, layout, cu_seqlens);
  return c;
}

}  // namespace ot::py::gdn_args
