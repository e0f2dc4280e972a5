// Run-time CPU features and the one place where the instruction set is chosen.
#pragma once
#include <string>

namespace ot::cpu {

struct Features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool amx_permitted = false;  // Linux arch_prctl(ARCH_REQ_XCOMP_PERM) granted
  bool intel = false;          // vendor GenuineIntel (tuning only: e.g. its L2 streamer stops at 4 KiB pages)
};

// Detected once (CPUID + the Linux AMX permission request).
const Features& features();

// Ordered: each level implies the ones below it.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, amx = 4 };
const char* isa_name(Isa isa);
bool parse_isa(const std::string& s, Isa* out);

// Highest level the hardware and OS support.
Isa detected_isa();
// Level the dispatchers use: min(detected, OT_MAX_ISA, set_max_isa override).
Isa active_isa();
inline bool has(Isa isa) { return static_cast<int>(active_isa()) >= static_cast<int>(isa); }
// Programmatic cap (tests loop over every path in one process); returns the previous cap.
Isa set_max_isa(Isa isa);

// OT_FORCE_REF=1 (or set_force_ref(true)) routes every operator to its reference.
bool force_ref();
bool set_force_ref(bool on);

// RAII helpers for tests and tools.
struct ScopedMaxIsa {
  explicit ScopedMaxIsa(Isa isa) : prev(set_max_isa(isa)) {}
  ~ScopedMaxIsa() { set_max_isa(prev); }
  Isa prev;
};
struct ScopedForceRef {
  explicit ScopedForceRef(bool on) : prev(set_force_ref(on)) {}
  ~ScopedForceRef() { set_force_ref(prev); }
  bool prev;
};

}  // namespace ot::cpu
