// Gives the functions that follow (to router_vbmi_end.h) the AVX512_VBMI / VBMI2 targets; they run
// only where CPUID has them. No include guard: every file that needs the targets includes it.
// clang ignores GCC's target pragma: its own form applies the same target to every function.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vbmi,avx512vbmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512vbmi,avx512vbmi2")
#endif
