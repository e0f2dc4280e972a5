// AVX2 build of the recurrent token step (see recurrent_step.inc); dispatched by cpu::has.
#define OT_RS_NS avx2
#include "src/gdn/recurrent_step.inc"
