// The causal softmax of a block of score rows (causal_attention.cpp), per ISA: T rows of width S,
// ld apart; row t sees keys 0 .. off + t and the rest of its width is zeroed. lse (when given)
// gets each row's log-sum-exp; with lse_in the row becomes exp(s - lse) (the backward's recompute).
#pragma once
#include <cstdint>

namespace ot::attn {

using SoftmaxRows = void (*)(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in);
void softmax_rows_generic(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in);
void softmax_rows_avx2(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in);
void softmax_rows_avx512(float* P, int64_t T, int64_t S, int64_t ld, int64_t off, float* lse, const float* lse_in);

}  // namespace ot::attn
