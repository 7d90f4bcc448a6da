// The K-quant half of the expert kernel (kquants.h says what and why): Q8_K activations, the
// int8 dot products of Q4_K / Q5_K / Q6_K rows with them, and bit-exact dequantization.
//
// One code path per build, as for the rest of the kernel (built with -march=native for the CPU
// at hand): AVX-512 (BW) with VNNI's vpdpwssd where the CPU has it, AVX2, or plain C++. Each
// 64 (AVX-512) or 32 (AVX2) weights are unpacked to bytes 0..15 / 0..31 / 0..63 and multiplied
// with the activation's int8 by vpmaddubsw (u8 x s8 pairs summed to s16: at most 2 x 63 x 127,
// no saturation), then by the sub-block scale as 16-bit pairs into int32 lanes (vpmaddwd, or
// VNNI's vpdpwssd, which also accumulates; vpdpbusd then a vpmulld by the scale, the other way
// to use VNNI, was 7% slower at one token on the 2-core Zen 4 VM). A super-block's integer sum
// is exact; it meets the two fp32 scales once. That is llama.cpp's ggml_vec_dot_q4_K_q8_K and kin, with two rows and up
// to four activation rows per pass (every unpacked weight used for every token of the expert).

#include "kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fp16.h"
#if defined(__SSE__)
#include <immintrin.h>
#endif

#ifndef FT_PREFETCH  // as in moe_cpu.cpp: bytes ahead along each weight row
#define FT_PREFETCH 4096
#endif

namespace kq {

int64_t block_bytes(int64_t dtype) { return dtype == Q4_K ? 144 : dtype == Q5_K ? 176 : dtype == Q6_K ? 210 : 0; }

namespace {

inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Q4_K / Q5_K: the 8 6-bit scales and the 8 mins packed in 12 bytes, as ggml's
// get_scale_min_k4: scale j < 4 is the low 6 bits of byte j, min j < 4 of byte j + 4; for j >= 4
// the low 4 bits come from byte j + 4 (scale: low nibble, min: high nibble), the top 2 bits from
// the top bits of byte j - 4 (scale) or j (min).
// Returned as four little-endian words: scales 0-3, 4-7, mins 0-3, 4-7.
struct ScalesMins {
  uint32_t w[4];
};

inline ScalesMins scales_mins(const uint8_t* packed) {
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  return {{u[0] & low6, (u[2] & low4) | (((u[0] >> 6) & low2) << 4), u[1] & low6,
           ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4)}};
}

inline uint8_t byte_of(const ScalesMins& s, int i) { return uint8_t(s.w[i / 4] >> (8 * (i % 4))); }

// ---- dequantization: gguf-py's arithmetic, in its order (the build has -ffp-contract=off) ----

template <int64_t T> void dequant_block(const uint8_t* b, float* y) {
  if constexpr (T == Q6_K) {
    const float d = load_half(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 * half;
      const uint8_t* qh = b + 128 + 32 * half;
      float* out = y + 128 * half;
      const int8_t* s = sc + 8 * half;
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {  // values 32k .. 32k + 31: nibbles of ql[0:32] or ql[32:64], qh bits 2k, 2k + 1
        const uint8_t* low = ql + 32 * (k & 1);
        const int shift = 4 * (k >> 1);
#pragma GCC unroll 2
        for (int g = 0; g < 2; ++g) {  // one scale per 16 values
          const float ds = d * float(s[2 * k + g]);
          for (int l = 16 * g; l < 16 * g + 16; ++l) {
            const int q = ((low[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
            out[32 * k + l] = ds * float(q - 32);
          }
        }
      }
    }
  } else {
    const float d = load_half(b), dmin = load_half(b + 2);
    const ScalesMins sm = scales_mins(b + 4);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      const float ds = d * float(byte_of(sm, j)), dm = dmin * float(byte_of(sm, 8 + j));
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0xF;
        if constexpr (T == Q5_K) v |= ((qh[l] >> j) & 1) << 4;
        const float p = ds * float(v);
        y[32 * j + l] = p - dm;
      }
    }
  }
}

// The same values rounded to bf16 (float_to_bf16's rounding), for prefill's dequantize-then-GEMM
// path: with AVX-512, 16 values at a time, each the same IEEE products and differences as
// dequant_block (multiply, then subtract: never fused), so the bf16 values are the rounding of
// gguf-py's fp32 ones bit for bit; elsewhere dequant_block, then float_to_bf16.
#if defined(__AVX512F__) && defined(__AVX512BW__)

inline __m256i bf16_of(__m512 f) {  // nearest even, NaN quieted: float_to_bf16 in 16 lanes
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

inline void store_bf16(uint16_t* y, __m512 f) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), bf16_of(f)); }

template <int64_t T> void dequant_block_bf16(const uint8_t* b, uint16_t* y) {
  if constexpr (T == Q6_K) {
    const float d = load_half(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 * half;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {  // values 32k .. 32k + 31 of the half, as in dequant_block
        const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * (k & 1)));
        const __m256i lo4 = _mm256_and_si256(_mm256_srli_epi16(low, 4 * (k >> 1)), _mm256_set1_epi8(0x0F));
        const __m256i hi2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3)), 4);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo4, hi2), _mm256_set1_epi8(32));  // q - 32, int8
        const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
        for (int g = 0; g < 2; ++g) {  // one scale per 16 values
          const __m512 ds = _mm512_set1_ps(d * float(sc[8 * half + 2 * k + g]));
          store_bf16(y + 128 * half + 32 * k + 16 * g, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(halves[g]))));
        }
      }
    }
  } else {
    const float d = load_half(b), dmin = load_half(b + 2);
    const ScalesMins sm = scales_mins(b + 4);
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (T == Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 ds = _mm512_set1_ps(d * float(byte_of(sm, j))), dm = _mm512_set1_ps(dmin * float(byte_of(sm, 8 + j)));
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
      __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 4 * (j % 2)), _mm256_set1_epi8(0x0F));
      if constexpr (T == Q5_K)
        v = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4));
      const __m128i halves[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
      for (int h = 0; h < 2; ++h) {
        const __m512 p = _mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(halves[h])));
        store_bf16(y + 32 * j + 16 * h, _mm512_sub_ps(p, dm));
      }
    }
  }
}

#else

template <int64_t T> void dequant_block_bf16(const uint8_t* b, uint16_t* y) {
  float values[QK_K];
  dequant_block<T>(b, values);
  for (int i = 0; i < QK_K; ++i) y[i] = float_to_bf16(values[i]);
}

#endif

// ---- Q8_K activations ----

// x ~ d x q with d = amax / 127 (as 1 / (127 / amax)), q = x x (127 / amax) rounded to nearest
// even: the same in every build (and in the tests' numpy model of it).
inline void quantize_block(const float* x, Q8K& y) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  __m512 vmax = _mm512_setzero_ps();
  for (int k = 0; k < 16; ++k) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * k)));
  const float amax = _mm512_reduce_max_ps(vmax);
#else
  float amax = 0.f;
  for (int i = 0; i < QK_K; ++i) amax = std::max(amax, std::fabs(x[i]));
#endif
  if (amax == 0.f) {
    std::memset(&y, 0, sizeof(y));
    return;
  }
  const float iscale = 127.f / amax;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 vs = _mm512_set1_ps(iscale);
  for (int k = 0; k < 16; ++k) {  // one 16-value sum per vector
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), vs));  // MXCSR: nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y.qs + 16 * k), _mm512_cvtsepi32_epi8(q));
    y.bsums[k] = int16_t(_mm512_reduce_add_epi32(q));
  }
#else
  for (int i = 0; i < QK_K; ++i) y.qs[i] = int8_t(std::nearbyint(x[i] * iscale));
  for (int k = 0; k < 16; ++k) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += y.qs[16 * k + i];
    y.bsums[k] = int16_t(sum);
  }
#endif
  y.d = 1.f / iscale;
}

inline void prefetch_block(const uint8_t* p, int64_t nbytes) {
#if FT_PREFETCH > 0 && defined(__SSE__)
  for (int64_t off = 0; off < nbytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p) + off + FT_PREFETCH, _MM_HINT_T0);
#else
  (void)p, (void)nbytes;
#endif
}

// ---- dot products: one super-block of one row against NT activation rows ----
// acc[t].main collects d_w x d_x x (integer sum) lane-wise, acc[t].mins the same for the mins
// (Q4_K, Q5_K, dmin in place of d), subtracted at the end; both reduced once per row.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

// acc + w . x per 32-bit lane (4 bytes), each 16-bit pair sum first multiplied by its lane of sc
inline __m512i madd_scaled(__m512i acc, __m512i w, __m512i x, __m512i sc) {
  const __m512i pairs = _mm512_maddubs_epi16(w, x);  // u8 x s8, adjacent pairs summed: s16
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, pairs, sc);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, sc));
#endif
}

inline __m512i halves(int lo, int hi) {  // 16-bit lanes: lo in the low 256 bits, hi in the high
  return _mm512_inserti64x4(_mm512_set1_epi16(int16_t(lo)), _mm256_set1_epi16(int16_t(hi)), 1);
}

struct Acc {
  __m512 main = _mm512_setzero_ps();
  __m256 mins = _mm256_setzero_ps();
  float total() const {
    const __m128 m = _mm_add_ps(_mm256_castps256_ps128(mins), _mm256_extractf128_ps(mins, 1));
    const __m128 m2 = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm512_reduce_add_ps(main) - _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
  }
};

template <int64_t T, int NT> inline void block_dot(const uint8_t* b, const Q8K* const* act, int64_t i, Acc (&acc)[NT]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i sumi[NT];
  for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
  if constexpr (T == Q6_K) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m512i scz = _mm512_castsi256_si512(sc16);
    const __m512i high2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * half);
      const __m512i qh =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half)));
      // values 0-63 of the half: low nibbles of ql, qh bits 0-1 (values 0-31) and 2-3 (32-63);
      // values 64-127: high nibbles, qh bits 4-5 and 6-7; each moved to bits 4-5
      const __m512i w[2] = {
          _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_sllv_epi16(qh, halves(4, 2)), high2)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                          _mm512_and_si512(_mm512_srlv_epi16(qh, halves(0, 2)), high2))};
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const int c = 2 * half + k;  // 64-value chunk: scales 4c .. 4c + 3, 16 values (8 pair sums) each
        const auto quarter = [c](int k) { return _mm_set1_epi16(int16_t(4 * c + k)); };  // 8 lanes of scale 4c + k
        const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(quarter(1), quarter(0))),
                                               _mm256_set_m128i(quarter(3), quarter(2)), 1);
        const __m512i sc = _mm512_permutexvar_epi16(idx, scz);
        for (int t = 0; t < NT; ++t) sumi[t] = madd_scaled(sumi[t], w[k], _mm512_load_si512(act[t][i].qs + 64 * c), sc);
      }
    }
    const float d = load_half(b + 208);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      // (q - 32): 32 x sum over the 16-value groups of scale x activation sum, taken off in integers
      const __m256i offset = _mm256_madd_epi16(sc16, _mm256_load_si256(reinterpret_cast<const __m256i*>(x.bsums)));
      sumi[t] = _mm512_sub_epi32(sumi[t], _mm512_zextsi256_si512(_mm256_slli_epi32(offset, 5)));
      acc[t].main = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_set1_ps(d * x.d), acc[t].main);
    }
  } else {
    const ScalesMins sm = scales_mins(b + 4);  // built in registers: a vector load of stored words would stall
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_set_epi32(int(sm.w[3]), int(sm.w[2]), int(sm.w[1]), int(sm.w[0])));
    const __m512i smz = _mm512_castsi256_si512(sm16);
    // min j against the sums of its sub-block's two 16-value groups: lanes m0 m0 m1 m1 ... m7 m7
    const __m256i mins = _mm256_permutexvar_epi16(
        _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), sm16);
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    __m512i qh = _mm512_setzero_si512();
    if constexpr (T == Q5_K) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      // 32 bytes of qs into both halves: low nibbles are sub-block 2j, high nibbles 2j + 1,
      // which are activation values 64j .. 64j + 63 in order
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j)));
      __m512i w = _mm512_and_si512(_mm512_srlv_epi16(q, halves(0, 4)), low4);
      if constexpr (T == Q5_K) {  // fifth bit: bit 2j (low half) or 2j + 1 (high half) of qh
        const __m512i bit =
            _mm512_inserti64x4(_mm512_set1_epi8(char(1 << (2 * j))), _mm256_set1_epi8(char(2 << (2 * j))), 1);
        w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(qh, bit), w, _mm512_set1_epi8(16));
      }
      const __m512i sc = _mm512_permutexvar_epi16(halves(2 * j, 2 * j + 1), smz);
      for (int t = 0; t < NT; ++t) sumi[t] = madd_scaled(sumi[t], w, _mm512_load_si512(act[t][i].qs + 64 * j), sc);
    }
    const float d = load_half(b), dmin = load_half(b + 2);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      acc[t].main = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_set1_ps(d * x.d), acc[t].main);
      const __m256i m = _mm256_madd_epi16(mins, _mm256_load_si256(reinterpret_cast<const __m256i*>(x.bsums)));
      acc[t].mins = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(dmin * x.d), acc[t].mins);
    }
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

inline float hsum(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

struct Acc {
  __m256 main = _mm256_setzero_ps();
  __m128 mins = _mm_setzero_ps();
  float total() const {
    const __m128 m = _mm_add_ps(mins, _mm_movehl_ps(mins, mins));
    return hsum(main) - _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
  }
};

// acc + (w . x pair sums) x sc, 8 int32 lanes
inline __m256i madd_scaled(__m256i acc, __m256i w, __m256i x, __m256i sc) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc));
}

template <int64_t T, int NT> inline void block_dot(const uint8_t* b, const Q8K* const* act, int64_t i, Acc (&acc)[NT]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i sumi[NT];
  for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
  if constexpr (T == Q6_K) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m256i low2 = _mm256_set1_epi8(0x03);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * half + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
      const __m256i w[4] = {  // values 32k .. 32k + 31 of the half
          _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4))};
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * half + 2 * k;  // the chunk's two 16-value scales: bytes g (x8), g + 1 (x8)
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            sc8, _mm_set_epi64x(0x0101010101010101LL * (g + 1), 0x0101010101010101LL * g)));
        for (int t = 0; t < NT; ++t)
          sumi[t] = madd_scaled(sumi[t], w[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                                   act[t][i].qs + 128 * half + 32 * k)), sc);
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const float d = load_half(b + 208);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      const __m256i offset = _mm256_madd_epi16(sc16, _mm256_load_si256(reinterpret_cast<const __m256i*>(x.bsums)));
      sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(offset, 5));
      acc[t].main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * x.d), acc[t].main);
    }
  } else {
    const ScalesMins sm = scales_mins(b + 4);
    const __m128i sm8 = _mm_set_epi32(int(sm.w[3]), int(sm.w[2]), int(sm.w[1]), int(sm.w[0]));
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm8));  // 8 x s16 in each lane
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm8, 8));
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (T == Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256i bit0 = _mm256_set1_epi8(0x01);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (T == Q5_K) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), bit0), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), bit0), 4));
      }
      // scale of sub-block s in every 16-bit lane: bytes 2s, 2s + 1 of `scales`
      const __m256i sc_lo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * j))));
      const __m256i sc_hi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * j + 1))));
      for (int t = 0; t < NT; ++t) {
        const int8_t* a = act[t][i].qs + 64 * j;
        sumi[t] = madd_scaled(sumi[t], lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(a)), sc_lo);
        sumi[t] = madd_scaled(sumi[t], hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 32)), sc_hi);
      }
    }
    const float d = load_half(b), dmin = load_half(b + 2);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      acc[t].main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * x.d), acc[t].main);
      const __m128i pair_sums = _mm_hadd_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(x.bsums)),
                                               _mm_load_si128(reinterpret_cast<const __m128i*>(x.bsums + 8)));
      const __m128i m = _mm_madd_epi16(mins, pair_sums);
      acc[t].mins = _mm_fmadd_ps(_mm_cvtepi32_ps(m), _mm_set1_ps(dmin * x.d), acc[t].mins);
    }
  }
}

#else  // plain C++: the weights unpacked to bytes once per super-block, then integer sums per token

struct Acc {
  float main = 0.f, mins = 0.f;
  float total() const { return main - mins; }
};

template <int64_t T, int NT> inline void block_dot(const uint8_t* b, const Q8K* const* act, int64_t i, Acc (&acc)[NT]) {
  int8_t q[QK_K];  // Q4_K / Q5_K: 0..31; Q6_K: q - 32
  if constexpr (T == Q6_K) {
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 * half;
      const uint8_t* qh = b + 128 + 32 * half;
      for (int l = 0; l < 32; ++l) {
        q[128 * half + l] = int8_t(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
        q[128 * half + 32 + l] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        q[128 * half + 64 + l] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        q[128 * half + 96 + l] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_half(b + 208);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      int32_t sum = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t s = 0;
        for (int l = 0; l < 16; ++l) s += int32_t(q[16 * g + l]) * x.qs[16 * g + l];
        sum += sc[g] * s;
      }
      acc[t].main += d * x.d * float(sum);
    }
  } else {
    const ScalesMins sm = scales_mins(b + 4);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (T == Q5_K ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) {
        int v = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
        if constexpr (T == Q5_K) v |= ((qh[l] >> j) & 1) << 4;
        q[32 * j + l] = int8_t(v);
      }
    }
    const float d = load_half(b), dmin = load_half(b + 2);
    for (int t = 0; t < NT; ++t) {
      const Q8K& x = act[t][i];
      int32_t sum = 0, sum_mins = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) s += int32_t(q[32 * j + l]) * x.qs[32 * j + l];
        sum += byte_of(sm, j) * s;
        sum_mins += byte_of(sm, 8 + j) * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
      }
      acc[t].main += d * x.d * float(sum);
      acc[t].mins += dmin * x.d * float(sum_mins);
    }
  }
}

#endif

template <int64_t T, int NT>
void dot2(const uint8_t* a, const uint8_t* b, int64_t blocks, const Q8K* const* act, float* out_a, float* out_b) {
  constexpr int64_t bytes = T == Q4_K ? 144 : T == Q5_K ? 176 : 210;
  Acc acc_a[NT], acc_b[NT];
  for (int64_t i = 0; i < blocks; ++i) {  // the two rows' chains are independent: the core overlaps them
    prefetch_block(a + i * bytes, bytes);
    prefetch_block(b + i * bytes, bytes);
    block_dot<T, NT>(a + i * bytes, act, i, acc_a);
    block_dot<T, NT>(b + i * bytes, act, i, acc_b);
  }
  for (int t = 0; t < NT; ++t) {
    out_a[t] = acc_a[t].total();
    out_b[t] = acc_b[t].total();
  }
}

// One row against NT activation rows: a prompt's wide pass, NT independent chains without a
// second row's accumulators beside them (two rows' of eight tokens would leave the registers).
template <int64_t T, int NT> void dot1(const uint8_t* a, int64_t blocks, const Q8K* const* act, float* out) {
  constexpr int64_t bytes = T == Q4_K ? 144 : T == Q5_K ? 176 : 210;
  Acc acc[NT];
  for (int64_t i = 0; i < blocks; ++i) {
    prefetch_block(a + i * bytes, bytes);
    block_dot<T, NT>(a + i * bytes, act, i, acc);
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t].total();
}

template <int64_t T, int NT>
void dot2_wide(const uint8_t* a, const uint8_t* b, int64_t blocks, const Q8K* const* act, float* out_a, float* out_b) {
  dot1<T, NT>(a, blocks, act, out_a);
  if (b == a) {  // (an odd last row paired with itself)
    for (int t = 0; t < NT; ++t) out_b[t] = out_a[t];
  } else {
    dot1<T, NT>(b, blocks, act, out_b);
  }
}

template <int64_t T> void table_of(Dot2* fns) {
  static_assert(PAIRED_NT == 4 && MAX_NT == 8, "the table below");
  fns[0] = dot2<T, 1>; fns[1] = dot2<T, 2>; fns[2] = dot2<T, 3>; fns[3] = dot2<T, 4>;
  fns[4] = dot2_wide<T, 5>; fns[5] = dot2_wide<T, 6>; fns[6] = dot2_wide<T, 7>; fns[7] = dot2_wide<T, 8>;
}

}  // namespace

bool dot2_table(int64_t dtype, Dot2* fns) {
  switch (dtype) {
    case Q4_K: table_of<Q4_K>(fns); return true;
    case Q5_K: table_of<Q5_K>(fns); return true;
    case Q6_K: table_of<Q6_K>(fns); return true;
    default: return false;
  }
}

void quantize_q8k(const float* x, int64_t n, Q8K* out) {
  for (int64_t b = 0; b < n / QK_K; ++b) quantize_block(x + b * QK_K, out[b]);
}

namespace {

template <int64_t T> inline void block_to(const uint8_t* b, float* y) { dequant_block<T>(b, y); }
template <int64_t T> inline void block_to(const uint8_t* b, uint16_t* y) { dequant_block_bf16<T>(b, y); }

template <typename Out> bool row_to(int64_t dtype, const uint8_t* row, int64_t cols, Out* out) {
  const int64_t bytes = block_bytes(dtype);
  for (int64_t c = 0, at = 0; c < cols; c += QK_K, at += bytes) {
    switch (dtype) {
      case Q4_K: block_to<Q4_K>(row + at, out + c); break;
      case Q5_K: block_to<Q5_K>(row + at, out + c); break;
      case Q6_K: block_to<Q6_K>(row + at, out + c); break;
      default: return false;
    }
  }
  return true;
}

}  // namespace

bool dequant_row(int64_t dtype, const uint8_t* row, int64_t cols, float* out) { return row_to(dtype, row, cols, out); }

bool dequant_row_bf16(int64_t dtype, const uint8_t* row, int64_t cols, uint16_t* out) {
  return row_to(dtype, row, cols, out);
}

}  // namespace kq
