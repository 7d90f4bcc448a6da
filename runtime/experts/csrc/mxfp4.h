// GGML's MXFP4 blocks read in place by the expert kernel (mxfp4.cpp): the int8 products, the
// activation rows they take, and bit-exact dequantization. moe_cpu.cpp also multiplies MXFP4
// rows in fp32 (dot2<MXFP4>: the reference's products exactly), for float32 models.
//
// Block layout (GGML's block_mxfp4, gguf-py's MXFP4), 17 bytes per 32 values, kept as stored:
//   byte 0: e, an e8m0 exponent; bytes 1-16: 4-bit e2m1 codes, value j in the low nibble of
//   byte 1 + j and value j + 16 in its high nibble. value = KVALUES[code] x e8m0_half(e): the
//   table holds e2m1 doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), the scale is half
//   the power of two (ggml_e8m0_to_fp32_half), so both are exact and so is their product.
//
// The int8 products follow llama.cpp's ggml_vec_dot_mxfp4_q8_0: an activation row is quantized
// once per 32 values (int8 and an fp32 step), each weight block's codes become the int8 table
// values in registers (vpshufb), and each block's integer sum meets the two scales once.

#pragma once

#include <cstdint>

#include "fp16.h"

namespace mx {

constexpr int64_t QK = 32;           // values per block
constexpr int64_t BLOCK_BYTES = 17;  // exponent byte + 16 bytes of codes
constexpr int64_t MXFP4 = 9;         // its code in enum Dtype (moe_cpu.cpp)
constexpr int MAX_NT = 4;
// e2m1 doubled, as int8: the values a code stands for, before the (halved) block scale
constexpr int8_t KVALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ggml_e8m0_to_fp32_half: 2^(e - 128), the two smallest as fp32 subnormals
inline float e8m0_half(uint8_t e) { return bits_to_float(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23); }

// An activation row of n values (n a multiple of 32) as the int8 products take it, padded to
// whole 64-value pairs of blocks (P = n rounded up to 64): P bytes of int8 q, then P bytes of
// steps (each block's d repeated 8 times, one per 32-bit lane of its products), then P bytes of
// int32 lane corrections (mxfp4.cpp). x[i] ~ d x q[i], d = 1 / (127 / amax) per block, q
// rounded to nearest even (as Q8_K's).
int64_t act_row_bytes(int64_t n);
void quantize_row(const float* x, int64_t n, uint8_t* out);  // out: act_row_bytes(n), 64-byte aligned

// out_a[t] = row a . act[t] and out_b[t] = row b . act[t] for t < NT (the table's entry NT - 1):
// rows of `blocks` MXFP4 blocks, act[t] an activation row of quantize_row.
using Dot2 = void (*)(const uint8_t* a, const uint8_t* b, int64_t blocks, const uint8_t* const* act, float* out_a,
                      float* out_b);
void dot2_table(Dot2* fns);

// One row of `cols` values as fp32, bit for bit gguf-py's gguf.quants.dequantize.
void dequant_row(const uint8_t* row, int64_t cols, float* out);

}  // namespace mx
