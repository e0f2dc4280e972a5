// `ot demo --ep` (built only with MPI). The expert-parallel MoE layers (ep_moe_ffn over the ranks)
// are not wired into the demo yet: say so clearly instead of running something else.
#include "demo.h"
#include "ot/error.h"

namespace ot::demo {
int run_demo_ep(const DemoConfig&, const std::string&) {
  throw Error("ot demo", "--ep", "expert-parallel MoE layers in the demo (not implemented yet; use `ot bench ep` under mpirun)",
              "--ep");
}
}  // namespace ot::demo
