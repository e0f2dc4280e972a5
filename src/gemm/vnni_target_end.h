// Ends the AVX512_VNNI region that vnni_target_begin.h opened. No include guard.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
