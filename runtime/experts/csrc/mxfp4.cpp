// The MXFP4 half of the expert kernel (mxfp4.h says what and why): activation rows quantized per
// 32 values, the int8 dot products of MXFP4 rows with them, and bit-exact dequantization.
//
// One code path per build, as kquants.cpp: AVX-512 (BW) takes two blocks (64 values) a step,
// with VNNI's vpdpbusd where the CPU has it, vpmaddubsw + vpmaddwd where not; AVX2 one block a
// step; plain C++ otherwise. A block's 16 code bytes become its 32 table values plus 12 (0..24,
// unsigned) by one vpshufb, so u8 x s8 instructions multiply them with the int8 activations;
// the 12 x (sum of 4 activations) this adds to each 32-bit lane is taken off by starting the
// lane's sum at minus it, kept with the activation row (computed once per token, not per weight
// row). Lane sums (4 products, exact in int32) are scaled by weight step x activation step in
// fp32, the weight steps read from a 256-entry table.

#include "mxfp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#ifndef FT_PREFETCH  // as in moe_cpu.cpp: bytes ahead along each weight row
#define FT_PREFETCH 4096
#endif

namespace mx {

namespace {

constexpr int64_t PAIR = 2 * QK;  // the activation rows' padding unit (one AVX-512 step)
constexpr int OFFSET = 12;         // added to the table values: 0..24, unsigned

inline int64_t padded(int64_t n) { return (n + PAIR - 1) / PAIR * PAIR; }

// e8m0_half of every exponent byte: a scalar load where the arithmetic took a compare and a select
struct StepTable {
  alignas(64) float v[256];
  StepTable() {
    for (int e = 0; e < 256; ++e) v[e] = e8m0_half(uint8_t(e));
  }
};
const StepTable STEPS;

// Where an activation row's parts are (act_row_bytes: P bytes of q, then P bytes of steps, then
// P bytes of lane corrections, P = n rounded up to 64)
struct ActRow {
  const int8_t* q = nullptr;
  const float* step = nullptr;    // 8 per block
  const int32_t* corr = nullptr;  // 8 per block: -12 x the sum of the lane's 4 q
  ActRow() = default;
  ActRow(const uint8_t* row, int64_t n)
      : q(reinterpret_cast<const int8_t*>(row)), step(reinterpret_cast<const float*>(row + padded(n))),
        corr(reinterpret_cast<const int32_t*>(row + 2 * padded(n))) {}
};

inline void prefetch(const uint8_t* p) {
#if FT_PREFETCH > 0 && defined(__SSE__)
  _mm_prefetch(reinterpret_cast<const char*>(p) + FT_PREFETCH, _MM_HINT_T0);
#else
  (void)p;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// acc + the sums of 4 adjacent products w_u8 . x_s8 per 32-bit lane
inline __m512i dot_u8s8(__m512i acc, __m512i w, __m512i x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}

// the table values + OFFSET, as bytes
inline __m128i offset_table() {
  return _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(KVALUES)), _mm_set1_epi8(OFFSET));
}

// Two blocks of one row (the second absent: zeros) decoded for every token's products.
struct Pair {
  __m512i w;    // the 64 table values + OFFSET, in value order
  __m512 step;  // lanes 0-7: the first block's e8m0_half, 8-15: the second's
};

template <bool TWO> inline Pair decode_pair(const uint8_t* p) {
  const __m512i table = _mm512_broadcast_i32x4(offset_table());
  const __m512i shifts = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                          0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
  const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 1));
  const __m128i q1 = TWO ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + BLOCK_BYTES + 1)) : _mm_setzero_si128();
  // 128-bit lanes: block 0's bytes twice, block 1's twice; low nibbles in lanes 0 and 2 (values
  // 0-15 of each block), high nibbles in lanes 1 and 3 (values 16-31)
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(q0)),
                                          _mm256_broadcastsi128_si256(q1), 1);
  const __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(both, shifts), _mm512_set1_epi8(0x0F));
  Pair out;
  out.w = _mm512_shuffle_epi8(table, codes);
  out.step = _mm512_set1_ps(STEPS.v[p[0]]);
  if constexpr (TWO) out.step = _mm512_mask_broadcastss_ps(out.step, 0xFF00, _mm_load_ss(&STEPS.v[p[BLOCK_BYTES]]));
  else out.step = _mm512_maskz_mov_ps(0x00FF, out.step);  // (the padding's q are 0: any finite step does)
  return out;
}

template <int NT>
void dot2(const uint8_t* a, const uint8_t* b, int64_t blocks, const uint8_t* const* act, float* out_a, float* out_b) {
  ActRow x[NT];
  for (int t = 0; t < NT; ++t) x[t] = ActRow(act[t], blocks * QK);
  __m512 acc_a[NT], acc_b[NT];
  for (int t = 0; t < NT; ++t) acc_a[t] = acc_b[t] = _mm512_setzero_ps();
  const auto step = [&](int64_t blk, const Pair& wa, const Pair& wb) {
    for (int t = 0; t < NT; ++t) {
      const __m512i q = _mm512_loadu_si512(x[t].q + blk * QK);
      const __m512i corr = _mm512_loadu_si512(x[t].corr + 8 * blk);
      const __m512 xs = _mm512_loadu_ps(x[t].step + 8 * blk);
      acc_a[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_u8s8(corr, wa.w, q)), _mm512_mul_ps(wa.step, xs), acc_a[t]);
      acc_b[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_u8s8(corr, wb.w, q)), _mm512_mul_ps(wb.step, xs), acc_b[t]);
    }
  };
  int64_t blk = 0;
  for (; blk + 2 <= blocks; blk += 2) {
    const uint8_t* pa = a + blk * BLOCK_BYTES;
    const uint8_t* pb = b + blk * BLOCK_BYTES;
    prefetch(pa);
    prefetch(pb);
    step(blk, decode_pair<true>(pa), decode_pair<true>(pb));
  }
  if (blk < blocks) step(blk, decode_pair<false>(a + blk * BLOCK_BYTES), decode_pair<false>(b + blk * BLOCK_BYTES));
  for (int t = 0; t < NT; ++t) {
    out_a[t] = _mm512_reduce_add_ps(acc_a[t]);
    out_b[t] = _mm512_reduce_add_ps(acc_b[t]);
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline __m256i dot_u8s8(__m256i w, __m256i x) {  // sums of 4 adjacent products per 32-bit lane
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

struct Block {
  __m256i w;  // the 32 table values + OFFSET
  __m256 step;
};

inline Block decode_block(const uint8_t* p) {
  const __m128i table = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(KVALUES)), _mm_set1_epi8(OFFSET));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 1));
  const __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
  Block out;
  out.w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), codes);
  out.step = _mm256_broadcast_ss(&STEPS.v[p[0]]);
  return out;
}

template <int NT>
void dot2(const uint8_t* a, const uint8_t* b, int64_t blocks, const uint8_t* const* act, float* out_a, float* out_b) {
  ActRow x[NT];
  for (int t = 0; t < NT; ++t) x[t] = ActRow(act[t], blocks * QK);
  __m256 acc_a[NT], acc_b[NT];
  for (int t = 0; t < NT; ++t) acc_a[t] = acc_b[t] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* pa = a + blk * BLOCK_BYTES;
    const uint8_t* pb = b + blk * BLOCK_BYTES;
    prefetch(pa);
    prefetch(pb);
    const Block wa = decode_block(pa), wb = decode_block(pb);
    for (int t = 0; t < NT; ++t) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + blk * QK));
      const __m256i corr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].corr + 8 * blk));
      const __m256 xs = _mm256_loadu_ps(x[t].step + 8 * blk);
      const __m256i sa = _mm256_add_epi32(corr, dot_u8s8(wa.w, q)), sb = _mm256_add_epi32(corr, dot_u8s8(wb.w, q));
      acc_a[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), _mm256_mul_ps(wa.step, xs), acc_a[t]);
      acc_b[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), _mm256_mul_ps(wb.step, xs), acc_b[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    out_a[t] = hsum(acc_a[t]);
    out_b[t] = hsum(acc_b[t]);
  }
}

#else  // plain C++: each block's values as int8 once, then an integer sum per token

inline void decode_block(const uint8_t* p, int8_t (&w)[QK]) {
  for (int j = 0; j < 16; ++j) {
    w[j] = KVALUES[p[1 + j] & 0x0F];
    w[j + 16] = KVALUES[p[1 + j] >> 4];
  }
}

template <int NT>
void dot2(const uint8_t* a, const uint8_t* b, int64_t blocks, const uint8_t* const* act, float* out_a, float* out_b) {
  float acc_a[NT] = {}, acc_b[NT] = {};
  int8_t wa[QK], wb[QK];
  for (int64_t blk = 0; blk < blocks; ++blk) {
    decode_block(a + blk * BLOCK_BYTES, wa);
    decode_block(b + blk * BLOCK_BYTES, wb);
    const float da = STEPS.v[a[blk * BLOCK_BYTES]], db = STEPS.v[b[blk * BLOCK_BYTES]];
    for (int t = 0; t < NT; ++t) {
      const ActRow x(act[t], blocks * QK);
      int32_t sa = 0, sb = 0;
      for (int i = 0; i < QK; ++i) {
        sa += wa[i] * x.q[blk * QK + i];
        sb += wb[i] * x.q[blk * QK + i];
      }
      const float xs = x.step[8 * blk];
      acc_a[t] += float(sa) * (da * xs);
      acc_b[t] += float(sb) * (db * xs);
    }
  }
  for (int t = 0; t < NT; ++t) {
    out_a[t] = acc_a[t];
    out_b[t] = acc_b[t];
  }
}

#endif

}  // namespace

int64_t act_row_bytes(int64_t n) { return 3 * padded(n); }  // q, steps, corrections (ActRow)

void quantize_row(const float* x, int64_t n, uint8_t* out) {
  const int64_t p = padded(n);
  std::memset(out, 0, size_t(act_row_bytes(n)));  // the padding: q 0, step 0, correction 0
  int8_t* q = reinterpret_cast<int8_t*>(out);
  float* steps = reinterpret_cast<float*>(out + p);
  int32_t* corr = reinterpret_cast<int32_t*>(out + 2 * p);
  for (int64_t blk = 0; blk < n / QK; ++blk) {
    const float* v = x + blk * QK;
    float amax = 0.f;
    for (int i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(v[i]));
    if (amax == 0.f) continue;
    const float iscale = 127.f / amax;
    for (int i = 0; i < QK; ++i) q[blk * QK + i] = int8_t(std::nearbyint(v[i] * iscale));
    for (int lane = 0; lane < 8; ++lane) {
      const int8_t* g = q + blk * QK + 4 * lane;
      steps[8 * blk + lane] = 1.f / iscale;
      corr[8 * blk + lane] = -OFFSET * (g[0] + g[1] + g[2] + g[3]);
    }
  }
}

void dot2_table(Dot2* fns) {
  fns[0] = dot2<1>; fns[1] = dot2<2>; fns[2] = dot2<3>; fns[3] = dot2<4>;
}

void dequant_row(const uint8_t* row, int64_t cols, float* out) {
  for (int64_t c = 0; c < cols; c += QK, row += BLOCK_BYTES) {
    const float d = e8m0_half(row[0]);
    for (int j = 0; j < 16; ++j) {
      out[c + j] = d * float(KVALUES[row[1 + j] & 0x0F]);
      out[c + j + 16] = d * float(KVALUES[row[1 + j] >> 4]);
    }
  }
}

}  // namespace mx
