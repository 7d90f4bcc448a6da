// GGML's K-quants read in place by the expert kernel (kquants.cpp), and what moe_cpu.cpp needs of
// them: llama.cpp's CPU scheme. An activation row is quantized once to Q8_K (per 256 values an
// fp32 scale and int8 values), then each weight row's super-blocks are unpacked in registers and
// multiplied with it as 8-bit integers, each sub-block's sum scaled by its 6- or 8-bit scale, the
// mins (or Q6_K's -32 offset) applied through the activation's 16-value sums.
//
// Block layouts (GGML, 256 values per super-block, kept byte for byte as the GGUF stored them):
//   Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
//                    128 bytes of 4-bit q; value = d x scale x q - dmin x min
//   Q5_K, 176 bytes: as Q4_K, then 32 bytes of fifth bits (qh) before the 128 bytes of low bits
//   Q6_K, 210 bytes: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales (one per
//                    16 values), f16 d; value = d x scale x (q - 32)

#pragma once

#include <cstdint>

namespace kq {

constexpr int64_t QK_K = 256;  // values per super-block
enum Type : int64_t { Q4_K = 6, Q5_K = 7, Q6_K = 8 };  // codes of enum Dtype in moe_cpu.cpp

// One super-block of an activation row as Q8_K: x[i] ~ d x qs[i], |qs| <= 127, and the sum of qs
// over each 16 values.
struct alignas(64) Q8K {
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
  float d;
};

inline bool is_kquant(int64_t dtype) { return dtype == Q4_K || dtype == Q5_K || dtype == Q6_K; }
int64_t block_bytes(int64_t dtype);

// out_a[t] = row a . act[t] and out_b[t] = row b . act[t] for t < NT (the table's entry NT - 1):
// rows of `blocks` super-blocks, act[t] the Q8_K blocks of one activation row.
using Dot2 = void (*)(const uint8_t* a, const uint8_t* b, int64_t blocks, const Q8K* const* act, float* out_a,
                      float* out_b);
// Up to 4 tokens the two rows share a pass (their unpacked blocks used for every token); 5 to
// MAX_NT tokens, a prompt's, each row takes its own pass, the unpacked block used for more tokens.
constexpr int PAIRED_NT = 4;
constexpr int MAX_NT = 8;
bool dot2_table(int64_t dtype, Dot2* fns);  // false: not a K-quant; fills MAX_NT entries

// n values (a multiple of QK_K) as n / QK_K blocks.
void quantize_q8k(const float* x, int64_t n, Q8K* out);

// One row of `cols` values as fp32, bit for bit gguf-py's gguf.quants.dequantize. False: not a K-quant.
bool dequant_row(int64_t dtype, const uint8_t* row, int64_t cols, float* out);
// The same values rounded to bf16 as float_to_bf16 rounds them (SIMD where the build has AVX-512).
bool dequant_row_bf16(int64_t dtype, const uint8_t* row, int64_t cols, uint16_t* out);

}  // namespace kq
