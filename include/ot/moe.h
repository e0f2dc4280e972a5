// MoE operators, one process, forward (spec moe_ops.md sections 2-8, 10, 11). One spelling per
// operator everywhere (C++, torch op, CLI). Shape letters: T tokens, H hidden, I expert
// intermediate, E experts, K top-k. Every entry point validates all arguments and throws
// ot::Error naming the argument before writing anything; OT_FORCE_REF=1 routes to ot::moe::ref.
#pragma once
#include "ot/moe/ffn.h"
#include "ot/moe/grouped.h"
#include "ot/moe/quant_experts.h"
#include "ot/moe/loss.h"
#include "ot/moe/router.h"
#include "ot/moe/routing.h"
