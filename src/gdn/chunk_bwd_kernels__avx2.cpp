// AVX2 build of the backward chunk kernels (see chunk_bwd_kernels.inc); dispatched by chunk_bwd_kernels.cpp.
#define OT_CBK_NS avx2
#include "src/gdn/chunk_bwd_kernels.inc"
