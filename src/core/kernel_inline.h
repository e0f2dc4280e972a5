// OT_KERNEL_INLINE: forced inlining of a kernel's building blocks (the router kernels are one
// block of registers each: their speed depends on it). AddressSanitizer builds leave inlining to
// the compiler: instrumenting the fully inlined blocks took ~3-5x the compile time (the five
// router files 201 s -> 71 s in the ASan build) and those builds test memory, not speed.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define OT_KERNEL_INLINE
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OT_KERNEL_INLINE
#endif
#endif
#ifndef OT_KERNEL_INLINE
#define OT_KERNEL_INLINE __attribute__((always_inline))
#endif
