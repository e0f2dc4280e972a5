// Portable build of the recurrent token step (see recurrent_step.inc).
#define OT_RS_NS generic
#include "src/gdn/recurrent_step.inc"
