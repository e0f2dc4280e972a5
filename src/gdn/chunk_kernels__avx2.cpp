// AVX2 build of the chunk kernels (see chunk_kernels.inc); dispatched by chunk_kernels.cpp.
#define OT_CK_NS avx2
#include "src/gdn/chunk_kernels.inc"
