// A family's kernels as one ordered list (ISA, condition, function, name), most specific first and
// a portable entry last: the entry point validates, plans, looks its kernel up here, and runs it.
// The trace and OT_LOG name come from the same entry, so the name can never disagree with the
// kernel that ran. The choice depends only on the CPU (under set_max_isa), the call's plan and
// explicit knobs: never on timing, so two runs of one program pick the same kernels.
#pragma once
#include <cstddef>

#include "ot/cpu.h"
#include "ot/error.h"

namespace ot::cpu {

template <class Fn, class Plan> struct KernelEntry {
  Isa isa;                            // the lowest ISA level the kernel needs
  bool (*applies)(const Plan&);       // nullptr: every plan
  Fn fn;
  const char* name;                   // the trace / OT_LOG kernel name
};

// The first entry of `list` the active ISA runs that applies to `plan`. `family` names the list in
// the error thrown when nothing applies (a list without a portable last entry).
template <class Fn, class Plan, size_t N>
const KernelEntry<Fn, Plan>& select_kernel(const char* family, const KernelEntry<Fn, Plan> (&list)[N], const Plan& plan) {
  for (const auto& e : list)
    if (has(e.isa) && (!e.applies || e.applies(plan))) return e;
  throw Error(family, "plan", "a kernel of the list that applies (the list ends with a portable entry)", "none");
}

// Lists whose entries depend on the ISA alone.
struct AnyPlan {};
template <class Fn, size_t N> const KernelEntry<Fn, AnyPlan>& select_kernel(const char* family, const KernelEntry<Fn, AnyPlan> (&list)[N]) {
  return select_kernel(family, list, AnyPlan{});
}

}  // namespace ot::cpu
