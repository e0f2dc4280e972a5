// Gives the functions that follow (to vnni_target_end.h) the AVX512_VNNI target; they run only
// where CPUID has it. No include guard: every file that needs the target includes it.
// clang ignores GCC's target pragma: its own form applies the same target to every function.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#endif
