#include "ot/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ot::cpu {

static uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux keeps AMX tile data disabled until a process asks for it (arch_prctl, kernel >= 5.16).
static bool request_amx_permission() {
  constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask & (1ul << kXfeatureXtiledata)) != 0;
}

static Features detect() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;
  bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  bool os_amx = (xcr0 & 0x60000) == 0x60000;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_avx && (b & (1u << 5)) && f.fma && f.f16c;  // the avx2 units are built with -mf16c
  f.avx512f = os_avx512 && (b & (1u << 16));
  f.avx512dq = f.avx512f && (b & (1u << 17));
  f.avx512bw = f.avx512f && (b & (1u << 30));
  f.avx512vl = f.avx512f && (b & (1u << 31));
  f.avx512_vnni = f.avx512f && (c & (1u << 11));
  f.avx512_fp16 = f.avx512f && (d & (1u << 23));
  f.amx_bf16 = os_amx && (d & (1u << 22));
  f.amx_tile = os_amx && (d & (1u << 24));
  f.amx_int8 = os_amx && (d & (1u << 25));
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512_bf16 = f.avx512f && (a & (1u << 5));
  if (f.amx_tile && f.amx_bf16) f.amx_permitted = request_amx_permission();
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::amx: return "amx";
  }
  return "?";
}

bool parse_isa(const std::string& s, Isa* out) {
  for (int i = 0; i <= int(Isa::amx); ++i) {
    if (s == isa_name(Isa(i))) { *out = Isa(i); return true; }
  }
  return false;
}

Isa detected_isa() {
  static const Isa isa = [] {
    const Features& f = features();
    bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    if (avx512 && f.avx512_bf16 && f.amx_tile && f.amx_bf16 && f.amx_permitted) return Isa::amx;
    if (avx512 && f.avx512_bf16) return Isa::avx512_bf16;
    if (avx512) return Isa::avx512;
    if (f.avx2) return Isa::avx2;
    return Isa::scalar;
  }();
  return isa;
}

static Isa env_cap() {
  static const Isa cap = [] {
    Isa c = Isa::amx;
    if (const char* s = std::getenv("OT_MAX_ISA")) parse_isa(s, &c);
    return c;
  }();
  return cap;
}

static std::atomic<int> g_cap{int(Isa::amx)};
static std::atomic<int> g_force_ref{-1};  // -1: follow OT_FORCE_REF

Isa active_isa() {
  int v = std::min({int(detected_isa()), int(env_cap()), g_cap.load(std::memory_order_relaxed)});
  return Isa(v);
}

Isa set_max_isa(Isa isa) { return Isa(g_cap.exchange(int(isa))); }

bool force_ref() {
  int v = g_force_ref.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  static const bool env = [] {
    const char* s = std::getenv("OT_FORCE_REF");
    return s && std::strcmp(s, "0") != 0 && *s;
  }();
  return env;
}

bool set_force_ref(bool on) {
  bool prev = force_ref();
  g_force_ref.store(on ? 1 : 0);
  return prev;
}

}  // namespace ot::cpu
