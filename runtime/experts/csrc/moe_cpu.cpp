// ft's CPU expert kernel: the routed experts of one MoE layer, read straight from a host bank
// in the FTW layout (docs/FTW.md), with SwiGLU fused between the two projections.
//
// Decode is a stream of weights: K experts x 3 x H x I elements read once, a few FMAs each. So
// the kernel is organized around the stream: the selected experts' rows are cut into work items
// in bank order, every thread takes contiguous runs of them (long sequential streams, prefetched
// in software), converts each weight vector to fp32 once and uses it for every token routed to
// that expert (up to 4 at a time, in registers). Products equal the reference's (dequantized
// weight x activation in fp32) bit for bit; only the summation order differs. GGML K-quant rows
// (Q4_K, Q5_K, Q6_K) are the exception: kquants.cpp multiplies them in integers against
// activations quantized to Q8_K once per call, as llama.cpp does (kquants.h); so does
// mxfp4.cpp for MXFP4 rows when the layout asks for it (activations as int8 per 32 values),
// else MXFP4 goes the fp32 way, exact like the others.
//
// Between the projections: the layout's activation (silu(g) * u, or gpt-oss's / DeepSeek-V4's
// clamped forms, runtime/experts/activation.py) after adding the records' biases where they
// have them, and the down projection's bias after it.
//
// Plain C ABI, no torch headers: builds in a few seconds with g++ alone, loaded with ctypes.
// Threads come from OpenMP (libgomp.so.1: the same runtime torch has already loaded).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

#include <omp.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "fp16.h"
#include "kquants.h"  // Q4_K, Q5_K, Q6_K: kquants.cpp, built with this file
#include "mxfp4.h"    // MXFP4's int8 products: mxfp4.cpp, built with this file

// Software prefetch distance in bytes along each weight row (0: off). The hardware prefetchers
// alone leave a core's stream well under its share of DRAM bandwidth: on a 16-core Sapphire
// Rapids, 4 KiB ahead took 16-thread bf16 decode from ~90-100 to ~115-140 GB/s, and one thread
// from 10 to 14 GB/s; 2 KiB and 8 KiB did about as well, 16 KiB worse, the L2 hint no better.
#ifndef FT_PREFETCH
#define FT_PREFETCH 4096
#endif
#ifndef FT_PREFETCH_HINT
#define FT_PREFETCH_HINT _MM_HINT_T0
#endif

namespace {

enum Dtype : int64_t {
  F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4, Q8_0 = 5, Q4_K = 6, Q5_K = 7, Q6_K = 8, MXFP4 = 9
};
static_assert(int64_t(Q4_K) == kq::Q4_K && int64_t(Q5_K) == kq::Q5_K && int64_t(Q6_K) == kq::Q6_K &&
              int64_t(MXFP4) == mx::MXFP4, "kquants.h and mxfp4.h number them alike");

// One weight matrix of an expert record, as stored. Mirrored by cpu_kernels._Mat (all int64).
struct Mat {
  int64_t offset;        // bytes from the record start to row 0
  int64_t row_bytes;
  int64_t dtype;
  int64_t rows, cols;
  int64_t scale_offset;  // f32 block scales [ceil(rows/block_rows), scale_stride], -1: none
  int64_t scale_stride;
  int64_t block_rows, block_cols;
};

// How gate and up combine (ftw.format.ExpertActivation; activation.py is the reference).
// RELU2 (Nemotron-H) is not gated: relu(u)^2 of the up rows alone (w13 is [I, H]; `gate` then
// names the same rows as `up` and is not read, nor is a gate bias); so is SILU (Doge): silu(u).
enum Activation : int64_t { SWIGLU = 0, SWIGLU_CLAMPED = 1, SWIGLU_LIMITED = 2, GEGLU_TANH = 3, RELU2 = 4, SILU = 5 };
inline bool gated_kind(int64_t kind) { return kind != RELU2 && kind != SILU; }

struct Layout {  // Mirrored by cpu_kernels._Layout.
  Mat gate, up, down;  // gate/up: [I, H] (rows I..2I of w13 are `up`; rows 0..I where not gated), down: [H, I]
  int64_t record_stride;
  int64_t num_experts;
  int64_t activation;  // enum Activation
  double alpha, limit;  // swiglu_clamped's alpha; the clamps' limit (the clamped kinds only)
  int64_t gate_bias, up_bias, down_bias;  // byte offsets in a record of [I], [I], [H] vectors; -1: none
  int64_t bias_dtype;  // F32, F16 or BF16
  int64_t mxfp4_int8;  // MXFP4 matrices: int8 products with activations quantized per 32 (else fp32)
};

// h = act(gate, up) for one element, in fp32: activation.py's `activate`.
struct Act {
  int64_t kind;
  float alpha, limit;
  explicit Act(const Layout& L) : kind(L.activation), alpha(float(L.alpha)), limit(float(L.limit)) {}
  inline float operator()(float g, float u) const {
    if (kind == SWIGLU) return g / (1.f + std::exp(-g)) * u;
    if (kind == RELU2) {  // (g is not read: no gate)
      const float r = u > 0.f ? u : 0.f;
      return r * r;
    }
    if (kind == SILU) return u / (1.f + std::exp(-u));  // (g is not read: no gate)
    if (kind == GEGLU_TANH)  // (Gemma 4: GELU's tanh form, sqrt(2 / pi) (g + 0.044715 g^3), as torch's)
      return 0.5f * g * (1.f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    g = std::min(g, limit);  // (NaN stays NaN, as in torch's clamp)
    u = std::min(std::max(u, -limit), limit);
    if (kind == SWIGLU_CLAMPED) return g / (1.f + std::exp(-alpha * g)) * (u + 1.f);
    return g / (1.f + std::exp(-g)) * u;  // SWIGLU_LIMITED
  }
};

// ---- scalar conversions (tails, and the whole job on CPUs without AVX2) ----
// (bits_to_float, half_to_float: fp16.h)

// FP8 e4m3 -> the fp16 with the same sign, exponent and mantissa bits: exactly value / 256,
// subnormals included (fp16 has a wider exponent). The x256 is folded into the multiplier.
inline uint16_t e4m3_as_half(uint8_t b) { return uint16_t(((b & 0x7f) << 7) | ((b & 0x80) << 8)); }

template <int D> inline float load1(const uint8_t* p, int64_t i) {
  if constexpr (D == F32) { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
  if constexpr (D == F16) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return half_to_float(h); }
  if constexpr (D == BF16) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bits_to_float(uint32_t(h) << 16); }
  if constexpr (D == E4M3) return half_to_float(e4m3_as_half(p[i]));
  if constexpr (D == E5M2) return half_to_float(uint16_t(p[i]) << 8);  // e5m2 is the top byte of fp16
  if constexpr (D == Q8_0) return float(int8_t(p[i]));
  // MXFP4: p at a block's 16 code bytes; value i < 16 in the low nibble of byte i, i >= 16 in
  // the high nibble of byte i - 16; as the table's doubled e2m1 (the block scale multiplies)
  if constexpr (D == MXFP4) return float(mx::KVALUES[(p[i & 15] >> (4 * (i >> 4))) & 0x0F]);
  return 0.f;
}

#if defined(__SSSE3__)
// MXFP4 values [i, i + 16) of a block (i = 0 or 16): the table's int8 values of 16 codes
inline __m128i mxfp4_values16(const uint8_t* p, int64_t i) {
  __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (i >= 16) q = _mm_srli_epi16(q, 4);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mx::KVALUES));
  return _mm_shuffle_epi8(table, _mm_and_si128(q, _mm_set1_epi8(0x0F)));
}
#endif

// ---- vectors: AVX-512, AVX2+FMA+F16C, or one lane ----

#if defined(__AVX512F__) && defined(__AVX512BW__)
using vf = __m512;
constexpr int W = 16;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset(float s) { return _mm512_set1_ps(s); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf a) { _mm512_storeu_ps(p, a); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
inline __m256i e4m3_as_half8(__m256i w) {
  return _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                         _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
}
template <int D> inline vf loadv(const uint8_t* p, int64_t i) {
  if constexpr (D == F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i);
  if constexpr (D == F16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
  if constexpr (D == BF16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  if constexpr (D == E4M3 || D == E5M2) {
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    return _mm512_cvtph_ps(D == E4M3 ? e4m3_as_half8(w) : _mm256_slli_epi16(w, 8));
  }
  if constexpr (D == Q8_0)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
  if constexpr (D == MXFP4) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(mxfp4_values16(p, i)));  // i: 0 or 16
  return vzero();
}
// Elements [i, i + 2W): FP8 converts 32 at a time (one widening, one bit shuffle, two cvtph).
template <int D> inline void load2(const uint8_t* p, int64_t i, vf& lo, vf& hi) {
  if constexpr (D == MXFP4) {  // a whole block (i = 0): its low nibbles, then its high ones
    lo = loadv<D>(p, 0);
    hi = loadv<D>(p, 16);
  } else if constexpr (D == E4M3 || D == E5M2) {
    __m512i w = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))), 8);
    // e4m3 in the high byte: sign, E, m; >> 1 (arithmetic) and clearing bit 14 gives e4m3_as_half
    if constexpr (D == E4M3) w = _mm512_and_si512(_mm512_srai_epi16(w, 1), _mm512_set1_epi16(int16_t(0xBFFF)));
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(w));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1));
  } else {
    lo = loadv<D>(p, i);
    hi = loadv<D>(p, i + W);
  }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
using vf = __m256;
constexpr int W = 8;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset(float s) { return _mm256_set1_ps(s); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
template <int D> inline vf loadv(const uint8_t* p, int64_t i) {
  if constexpr (D == F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
  if constexpr (D == F16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
  if constexpr (D == BF16) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  if constexpr (D == E4M3 || D == E5M2) {
    __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i)));
    __m128i h = D == E4M3 ? _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7),
                                         _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8))
                          : _mm_slli_epi16(w, 8);
    return _mm256_cvtph_ps(h);
  }
  if constexpr (D == Q8_0)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i))));
  if constexpr (D == MXFP4) {  // i: 0, 8, 16 or 24 (the low 8 bytes of a 16-value load)
    const __m128i v = mxfp4_values16(p, i & 16);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32((i & 8) ? _mm_srli_si128(v, 8) : v));
  }
  return vzero();
}
template <int D> inline void load2(const uint8_t* p, int64_t i, vf& lo, vf& hi) {
  if constexpr (D == E4M3 || D == E5M2) {  // 16 at a time, as the AVX-512 path does 32
    __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))), 8);
    if constexpr (D == E4M3) w = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(int16_t(0xBFFF)));
    lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
    hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
  } else {
    lo = loadv<D>(p, i);
    hi = loadv<D>(p, i + W);
  }
}
#else
using vf = float;
constexpr int W = 1;
inline vf vzero() { return 0.f; }
inline vf vset(float s) { return s; }
inline vf vload(const float* p) { return *p; }
inline void vstore(float* p, vf a) { *p = a; }
inline vf vfma(vf a, vf b, vf c) { return std::fma(a, b, c); }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vadd(vf a, vf b) { return a + b; }
inline float vsum(vf a) { return a; }
template <int D> inline vf loadv(const uint8_t* p, int64_t i) { return load1<D>(p, i); }
template <int D> inline void load2(const uint8_t* p, int64_t i, vf& lo, vf& hi) {
  lo = load1<D>(p, i);
  hi = load1<D>(p, i + 1);
}
#endif

// ---- two rows (a, b) against NT activation rows: the inner loop of both projections ----

constexpr int64_t elem_bytes(int64_t d) { return d == F32 ? 4 : (d == F16 || d == BF16) ? 2 : 1; }

// Touch the cache lines FT_PREFETCH bytes past elements [i, i + 2W) of a row.
template <int D> inline void prefetch_ahead(const uint8_t* row, int64_t i) {
#if FT_PREFETCH > 0 && (defined(__SSE__) || defined(__AVX2__))
  const char* p = reinterpret_cast<const char*>(row) + i * elem_bytes(D) + FT_PREFETCH;
  for (int64_t off = 0; off < 2 * W * elem_bytes(D); off += 64) _mm_prefetch(p + off, FT_PREFETCH_HINT);
#else
  (void)row, (void)i;
#endif
}

template <int NT>
constexpr int NA = NT <= 2 ? 2 : 1;  // accumulators per (row, token): few tokens need two to hide FMA latency

// Accumulate columns [c0, c0 + n) of rows a and b (pointers at their element c0), the weights
// multiplied by ma / mb (a block scale) when SCALED. Products are fp32-rounded exactly as the
// reference's dequantized weight x activation.
// FIXED > 0: n is that compile-time constant (a q8_0 block, a 128-column FP8 scale block), so
// the loop unrolls and the per-block overhead disappears.
template <int D, int NT, bool SCALED, int FIXED = 0>
inline void segment(const uint8_t* a, const uint8_t* b, float ma, float mb, const float* const* xs, int64_t c0,
                    int64_t n_runtime, vf (&acc_a)[NA<NT>][NT], vf (&acc_b)[NA<NT>][NT], float (&tail_a)[NT],
                    float (&tail_b)[NT]) {
  constexpr int hi_acc = NA<NT> - 1;
  const int64_t n = FIXED > 0 ? FIXED : n_runtime;
  const vf va = vset(ma), vb = vset(mb);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    prefetch_ahead<D>(a, i);
    prefetch_ahead<D>(b, i);
    vf wa0, wa1, wb0, wb1;
    load2<D>(a, i, wa0, wa1);
    load2<D>(b, i, wb0, wb1);
    if constexpr (SCALED) { wa0 = vmul(wa0, va); wa1 = vmul(wa1, va); wb0 = vmul(wb0, vb); wb1 = vmul(wb1, vb); }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const vf x0 = vload(xs[t] + c0 + i), x1 = vload(xs[t] + c0 + i + W);
      acc_a[0][t] = vfma(wa0, x0, acc_a[0][t]);
      acc_b[0][t] = vfma(wb0, x0, acc_b[0][t]);
      acc_a[hi_acc][t] = vfma(wa1, x1, acc_a[hi_acc][t]);
      acc_b[hi_acc][t] = vfma(wb1, x1, acc_b[hi_acc][t]);
    }
  }
  for (; i + W <= n; i += W) {
    vf wa = loadv<D>(a, i), wb = loadv<D>(b, i);
    if constexpr (SCALED) { wa = vmul(wa, va); wb = vmul(wb, vb); }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const vf xv = vload(xs[t] + c0 + i);
      acc_a[0][t] = vfma(wa, xv, acc_a[0][t]);
      acc_b[0][t] = vfma(wb, xv, acc_b[0][t]);
    }
  }
  for (; i < n; ++i) {
    float wa = load1<D>(a, i), wb = load1<D>(b, i);
    if constexpr (SCALED) { wa *= ma; wb *= mb; }
    for (int t = 0; t < NT; ++t) {
      tail_a[t] = std::fma(wa, xs[t][c0 + i], tail_a[t]);
      tail_b[t] = std::fma(wb, xs[t][c0 + i], tail_b[t]);
    }
  }
}


// out_a[t] = row a . xs[t], out_b[t] = row b . xs[t]. sa / sb: the rows' block scales (or null).
template <int D, int NT>
void dot2(const uint8_t* a, const uint8_t* b, const float* sa, const float* sb, const Mat& m,
          const float* const* xs, float* out_a, float* out_b) {
  vf acc_a[NA<NT>][NT], acc_b[NA<NT>][NT];
  float tail_a[NT], tail_b[NT];
  for (int t = 0; t < NT; ++t) {
    for (int k = 0; k < NA<NT>; ++k) acc_a[k][t] = acc_b[k][t] = vzero();
    tail_a[t] = tail_b[t] = 0.f;
  }
  if constexpr (D == Q8_0) {  // blocks of 34 bytes: fp16 scale d, 32 int8; weight = d x q
    for (int64_t c = 0, blk = 0; c < m.cols; c += 32, blk += 34) {
      uint16_t da, db;
      std::memcpy(&da, a + blk, 2);
      std::memcpy(&db, b + blk, 2);
      segment<D, NT, true, 32>(a + blk + 2, b + blk + 2, half_to_float(da), half_to_float(db), xs, c, 32, acc_a,
                               acc_b, tail_a, tail_b);
    }
  } else if constexpr (D == MXFP4) {  // blocks of 17 bytes: e8m0 exponent, 16 code bytes (mxfp4.h)
    for (int64_t c = 0, blk = 0; c < m.cols; c += mx::QK, blk += mx::BLOCK_BYTES) {
      segment<D, NT, true, 32>(a + blk + 1, b + blk + 1, mx::e8m0_half(a[blk]), mx::e8m0_half(b[blk]), xs, c, 32,
                               acc_a, acc_b, tail_a, tail_b);
    }
  } else {
    const float unit = D == E4M3 ? 256.f : 1.f;  // undo e4m3_as_half's / 256
    if (sa == nullptr) {
      segment<D, NT, D == E4M3>(a, b, unit, unit, xs, 0, m.cols, acc_a, acc_b, tail_a, tail_b);
    } else if (m.block_cols == 128 && m.cols % 128 == 0) {  // DeepSeek/Qwen FP8 blocks
      for (int64_t c = 0, k = 0; c < m.cols; c += 128, ++k) {
        segment<D, NT, true, 128>(a + c * elem_bytes(D), b + c * elem_bytes(D), sa[k] * unit, sb[k] * unit, xs, c,
                                  128, acc_a, acc_b, tail_a, tail_b);
      }
    } else {
      const int64_t step = m.block_cols, esize = elem_bytes(D);
      for (int64_t c = 0, k = 0; c < m.cols; c += step, ++k) {
        segment<D, NT, true>(a + c * esize, b + c * esize, sa[k] * unit, sb[k] * unit, xs, c,
                             std::min(step, m.cols - c), acc_a, acc_b, tail_a, tail_b);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    if constexpr (NA<NT> == 2) {
      acc_a[0][t] = vadd(acc_a[0][t], acc_a[1][t]);
      acc_b[0][t] = vadd(acc_b[0][t], acc_b[1][t]);
    }
    out_a[t] = vsum(acc_a[0][t]) + tail_a[t];
    out_b[t] = vsum(acc_b[0][t]) + tail_b[t];
  }
}

using Dot2 = void (*)(const uint8_t*, const uint8_t*, const float*, const float*, const Mat&, const float* const*,
                      float*, float*);
constexpr int MAX_NT = 4;  // tokens per pass over a row: accumulators stay in registers

template <int D> void table_of(Dot2* fns) {
  fns[0] = dot2<D, 1>; fns[1] = dot2<D, 2>; fns[2] = dot2<D, 3>; fns[3] = dot2<D, 4>;
}

bool dot2_table(int64_t dtype, Dot2* fns) {
  switch (dtype) {
    case F32: table_of<F32>(fns); return true;
    case F16: table_of<F16>(fns); return true;
    case BF16: table_of<BF16>(fns); return true;
    case E4M3: table_of<E4M3>(fns); return true;
    case E5M2: table_of<E5M2>(fns); return true;
    case Q8_0: table_of<Q8_0>(fns); return true;
    case MXFP4: table_of<MXFP4>(fns); return true;
    default: return false;
  }
}

// Tokens a pass over a row may take: MAX_NT, or kq::MAX_NT for the K-quants (RowDots::max_nt)
constexpr int PASS_NT = kq::MAX_NT;
static_assert(kq::MAX_NT >= MAX_NT && mx::MAX_NT == MAX_NT, "the tables serve 1..max_nt() tokens");

// Up to PASS_NT activation rows in the forms the row products take: fp32, Q8_K blocks, or
// MXFP4's int8 rows (mx::quantize_row); each matrix reads the one its RowDots names.
struct Acts {
  const float* f[PASS_NT];
  const kq::Q8K* k[PASS_NT];
  const uint8_t* m[PASS_NT];
};

// The row products of one matrix, whatever it is stored as: fp32 activations for the float,
// FP8, q8_0 and (exact) MXFP4 rows (dot2), their Q8_K blocks for the K-quants (kquants.cpp),
// int8 rows for MXFP4 with `mxfp4_int8` (mxfp4.cpp); the caller quantizes those once.
struct RowDots {
  enum Kind { FLOAT, Q8K, MX } kind = FLOAT;
  Dot2 f[MAX_NT] = {};
  kq::Dot2 k[kq::MAX_NT] = {};
  mx::Dot2 m[MAX_NT] = {};

  int max_nt() const { return kind == Q8K ? kq::MAX_NT : MAX_NT; }  // tokens a pass takes

  // false: a dtype without a kernel, or block rows of partial blocks
  bool bind(const Mat& mat, bool mxfp4_int8 = false) {
    kind = kq::is_kquant(mat.dtype) ? Q8K : mat.dtype == MXFP4 && mxfp4_int8 ? MX : FLOAT;
    if (mat.dtype == MXFP4 && mat.cols % mx::QK != 0) return false;
    if (kind == MX) mx::dot2_table(m);
    return kind == Q8K ? mat.cols % kq::QK_K == 0 && kq::dot2_table(mat.dtype, k)
                       : kind == MX || dot2_table(mat.dtype, f);
  }
  // rows a and b of `mat` against nt activation rows
  void operator()(int nt, const uint8_t* a, const uint8_t* b, const float* sa, const float* sb, const Mat& mat,
                  const Acts& x, float* out_a, float* out_b) const {
    if (kind == Q8K) k[nt - 1](a, b, mat.cols / kq::QK_K, x.k, out_a, out_b);
    else if (kind == MX) m[nt - 1](a, b, mat.cols / mx::QK, x.m, out_a, out_b);
    else f[nt - 1](a, b, sa, sb, mat, x.f, out_a, out_b);
  }
};

// Element i of a record's bias vector at `offset` (F32, F16 or BF16); 0 without one.
inline float bias_at(const uint8_t* record, int64_t offset, int64_t dtype, int64_t i) {
  if (offset < 0) return 0.f;
  const uint8_t* p = record + offset;
  return dtype == F32 ? load1<F32>(p, i) : dtype == F16 ? load1<F16>(p, i) : load1<BF16>(p, i);
}

inline const float* scale_row(const uint8_t* record, const Mat& m, int64_t row) {
  if (m.scale_offset < 0) return nullptr;
  return reinterpret_cast<const float*>(record + m.scale_offset) + (row / m.block_rows) * m.scale_stride;
}

// Rows [r0, r1) of matrix m of one expert record as bf16, out[r, c] at out + r * m.cols: each
// weight x its block scale in fp32, then rounded once (the reference's dequantize, then .to).
template <int D> void dequant_rows(const uint8_t* record, const Mat& m, int64_t r0, int64_t r1, uint16_t* out) {
  const float unit = D == E4M3 ? 256.f : 1.f;  // undo e4m3_as_half's / 256
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = record + m.offset + r * m.row_bytes;
    uint16_t* o = out + r * m.cols;
    if constexpr (D == Q8_0) {  // blocks of 34 bytes: fp16 scale d, 32 int8; weight = d x q
      for (int64_t c = 0, blk = 0; c < m.cols; c += 32, blk += 34) {
        uint16_t d;
        std::memcpy(&d, row + blk, 2);
        const float scale = half_to_float(d);
        for (int k = 0; k < 32; ++k) o[c + k] = float_to_bf16(scale * float(int8_t(row[blk + 2 + k])));
      }
    } else if constexpr (D == MXFP4) {  // gguf-py's values (exact in bf16 but for e8m0's extremes), rounded once
      float block[mx::QK];
      for (int64_t c = 0, blk = 0; c < m.cols; c += mx::QK, blk += mx::BLOCK_BYTES) {
        mx::dequant_row(row + blk, mx::QK, block);
        for (int k = 0; k < mx::QK; ++k) o[c + k] = float_to_bf16(block[k]);
      }
    } else {  // per scale block (or the whole row): W weights at a time through the SIMD loaders
      const float* s = scale_row(record, m, r);
      const int64_t step = s != nullptr ? m.block_cols : m.cols;
      float lanes[W];
      for (int64_t c0 = 0, k = 0; c0 < m.cols; c0 += step, ++k) {
        const int64_t c1 = std::min(c0 + step, m.cols);
        const float mult = (s != nullptr ? s[k] : 1.f) * unit;
        const vf vm = vset(mult);
        int64_t c = c0;
        for (; c + W <= c1; c += W) {
          vstore(lanes, vmul(loadv<D>(row, c), vm));
          for (int i = 0; i < W; ++i) o[c + i] = float_to_bf16(lanes[i]);
        }
        for (; c < c1; ++c) o[c] = float_to_bf16(load1<D>(row, c) * mult);
      }
    }
  }
}

// K-quant rows the same way: gguf-py's fp32 values, each rounded once (kq::dequant_row_bf16).
void dequant_rows_kquant(int64_t dtype, const uint8_t* record, const Mat& m, int64_t r0, int64_t r1, uint16_t* out) {
  for (int64_t r = r0; r < r1; ++r) kq::dequant_row_bf16(dtype, record + m.offset + r * m.row_bytes, m.cols, out + r * m.cols);
}

bool dequant_rows_of(int64_t dtype, const uint8_t* record, const Mat& m, int64_t r0, int64_t r1, uint16_t* out) {
  if (kq::is_kquant(dtype)) {
    if (m.cols % kq::QK_K != 0) return false;
    dequant_rows_kquant(dtype, record, m, r0, r1, out);
    return true;
  }
  switch (dtype) {
    case F32: dequant_rows<F32>(record, m, r0, r1, out); return true;
    case F16: dequant_rows<F16>(record, m, r0, r1, out); return true;
    case BF16: dequant_rows<BF16>(record, m, r0, r1, out); return true;
    case E4M3: dequant_rows<E4M3>(record, m, r0, r1, out); return true;
    case E5M2: dequant_rows<E5M2>(record, m, r0, r1, out); return true;
    case Q8_0: dequant_rows<Q8_0>(record, m, r0, r1, out); return true;
    case MXFP4: dequant_rows<MXFP4>(record, m, r0, r1, out); return true;
    default: return false;
  }
}

// Positions [l0, l1) for every query head (kv head h = query head / group), with an online
// softmax: m (running max), s (running sum of exp) and acc [Hq, v_dim] (running sum of exp x
// value), all fp32. Positions go in order and all heads of a position together, so a span reads
// its stretch of the cache front to back.
constexpr int64_t ATTEND_BLOCK = 16;  // positions whose scores are taken before their values are summed

template <int D>
void attend_span(const uint8_t* k, const uint8_t* v, const int64_t* st, int64_t kv_heads, int64_t group, int64_t dim,
                 int64_t v_dim, const float* q, float scale, int64_t l0, int64_t l1, float* m, float* s, float* acc) {
  const int64_t es = elem_bytes(D), heads = kv_heads * group;
  std::fill(m, m + heads, -INFINITY);
  std::fill(s, s + heads, 0.f);
  std::fill(acc, acc + heads * v_dim, 0.f);
  float p[ATTEND_BLOCK];
  const uint8_t* vrows[ATTEND_BLOCK];
  for (int64_t b0 = l0; b0 < l1; b0 += ATTEND_BLOCK) {
    const int64_t nb = std::min(ATTEND_BLOCK, l1 - b0);
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t b = 0; b < nb; ++b) vrows[b] = v + ((b0 + b) * st[2] + h * st[3]) * es;
      for (int64_t g = h * group; g < (h + 1) * group; ++g) {
        const float* qg = q + g * dim;
        float top = m[g];
        for (int64_t b = 0; b < nb; ++b) {  // the block's scores
          const uint8_t* kr = k + ((b0 + b) * st[0] + h * st[1]) * es;
          vf a = vzero();
          int64_t i = 0;
          for (; i + W <= dim; i += W) a = vfma(loadv<D>(kr, i), vload(qg + i), a);
          float score = vsum(a);
          for (; i < dim; ++i) score += load1<D>(kr, i) * qg[i];
          p[b] = score * scale;
          top = std::max(top, p[b]);
        }
        float* ag = acc + g * v_dim;
        const float c = std::exp(m[g] - top);  // what was summed so far shrinks by exp(old - new max)
        float sum = s[g] * c;
        for (int64_t b = 0; b < nb; ++b) {
          p[b] = std::exp(p[b] - top);
          sum += p[b];
        }
        s[g] = sum;
        m[g] = top;
        const vf vc = vset(c);
        int64_t i = 0;
        for (; i + W <= v_dim; i += W) {  // acc stays in a register across the block's values
          vf a = vmul(vload(ag + i), vc);
          for (int64_t b = 0; b < nb; ++b) a = vfma(loadv<D>(vrows[b], i), vset(p[b]), a);
          vstore(ag + i, a);
        }
        for (; i < v_dim; ++i) {
          float a = ag[i] * c;
          for (int64_t b = 0; b < nb; ++b) a += p[b] * load1<D>(vrows[b], i);
          ag[i] = a;
        }
      }
    }
  }
}

using AttendSpan = void (*)(const uint8_t*, const uint8_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                            const float*, float, int64_t, int64_t, float*, float*, float*);

constexpr int64_t ROWS_PER_ITEM = 16;  // one work item: 16 rows of one expert matrix
constexpr int64_t SUM_ROWS = 512;      // output rows per item of the final weighted sum

// n values of dtype F32, F16 or BF16 as fp32 into out. False (nothing written): another dtype.
bool to_floats(int64_t dtype, const void* in, int64_t n, float* out) {
  if (dtype != F32 && dtype != F16 && dtype != BF16) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == F32) out[i] = static_cast<const float*>(in)[i];
    else if (dtype == F16) out[i] = half_to_float(static_cast<const uint16_t*>(in)[i]);
    else out[i] = bits_to_float(uint32_t(static_cast<const uint16_t*>(in)[i]) << 16);
  }
  return true;
}

// The pairs [num_pairs] of a call, grouped by token in ascending order (token t owns pairs
// token_start[t] .. token_start[t + 1] - 1): out[t] = sum of weight[p] * expert_{expert[p]}(x[t])
// over t's pairs, in pair order (deterministic); a token without pairs gets zeros. fp32 x, out.
// K-quant matrices read Q8_K activations instead, int8 MXFP4 ones their int8 rows: x quantized
// once per token, h once per pair.
int moe_pairs(const uint8_t* bank, const Layout& L, int64_t num_tokens, int64_t num_pairs, const int64_t* ids,
              const int64_t* pair_token, const int64_t* token_start, const float* weights, const float* x, float* out,
              int64_t num_threads) {
  RowDots gate_dots, up_dots, down_dots;
  const bool mx8 = L.mxfp4_int8 != 0;
  if (!gate_dots.bind(L.gate, mx8) || !up_dots.bind(L.up, mx8) || !down_dots.bind(L.down, mx8)) return -2;
  if ((L.gate_bias >= 0 || L.up_bias >= 0 || L.down_bias >= 0) && L.bias_dtype != F32 && L.bias_dtype != F16 &&
      L.bias_dtype != BF16)
    return -2;
  const Act act(L);
  // gate and up of one dtype go row by row, gate row r with up row r; otherwise (GGUF mixes that
  // store them apart) rows r and r + 1 of each; without a gate, rows r and r + 1 of up alone
  const bool gated = gated_kind(L.activation);
  const bool fused = gated && L.gate.dtype == L.up.dtype;
  const int64_t hidden = L.gate.cols, inter = L.gate.rows;
  for (int64_t p = 0; p < num_pairs; ++p)
    if (ids[p] < 0 || ids[p] >= L.num_experts) return -1;

  // (token, expert) pairs grouped by expert: one run of pairs per distinct expert
  std::vector<int64_t> order(num_pairs);
  for (int64_t p = 0; p < num_pairs; ++p) order[p] = p;
  std::stable_sort(order.begin(), order.end(), [ids](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> run_start;
  for (int64_t i = 0; i < num_pairs; ++i)
    if (i == 0 || ids[order[i]] != ids[order[i - 1]]) run_start.push_back(i);
  const int64_t num_runs = int64_t(run_start.size());
  run_start.push_back(num_pairs);
  if (num_runs == 0) {  // no pairs: every token's sum is empty
    std::fill(out, out + num_tokens * hidden, 0.f);
    return 0;
  }

  std::vector<int64_t> position(num_pairs);  // pair -> its place in `order`
  for (int64_t i = 0; i < num_pairs; ++i) position[order[i]] = i;

  // Per pair (in `order`): h, the activations between the projections [inter], and y, the expert's output [hidden].
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(std::max<int64_t>(num_pairs, 1) * (inter + hidden)));
  float* const h = scratch.data();
  float* const y = h + num_pairs * inter;
  // Q8_K copies for the K-quants: xq [token][hidden / 256], hq [pair in `order`][inter / 256]
  const int64_t x_blocks = gate_dots.kind == RowDots::Q8K || up_dots.kind == RowDots::Q8K ? hidden / kq::QK_K : 0;
  const int64_t h_blocks = down_dots.kind == RowDots::Q8K ? inter / kq::QK_K : 0;
  thread_local std::vector<kq::Q8K> q8k_scratch;
  q8k_scratch.resize(size_t(num_tokens * x_blocks + num_pairs * h_blocks));
  kq::Q8K* const xq = q8k_scratch.data();
  kq::Q8K* const hq = xq + num_tokens * x_blocks;
  // int8 rows for MXFP4 products: xm [token], hm [pair in `order`]
  const int64_t xm_bytes = gate_dots.kind == RowDots::MX || up_dots.kind == RowDots::MX ? mx::act_row_bytes(hidden) : 0;
  const int64_t hm_bytes = down_dots.kind == RowDots::MX ? mx::act_row_bytes(inter) : 0;
  thread_local std::vector<uint8_t> mx_scratch;
  mx_scratch.resize(size_t(num_tokens * xm_bytes + num_pairs * hm_bytes));
  uint8_t* const xm = mx_scratch.data();
  uint8_t* const hm = xm + num_tokens * xm_bytes;
  const int64_t gate_items = num_runs * ((inter + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM);
  const int64_t down_items = num_runs * ((hidden + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM);
  const int64_t sum_items = num_tokens * ((hidden + SUM_ROWS - 1) / SUM_ROWS);
  // Small layers (tiny models, tests) are not worth waking many threads: one per 64 KiB of work.
  const int64_t expert_bytes =
      L.up.rows * ((gated ? L.gate.row_bytes : 0) + L.up.row_bytes) + L.down.rows * L.down.row_bytes;
  int64_t work_bytes = 0;
  for (int64_t run = 0; run < num_runs; ++run)
    work_bytes += expert_bytes * ((run_start[run + 1] - run_start[run] + MAX_NT - 1) / MAX_NT);
  const int threads = int(std::clamp<int64_t>(work_bytes >> 16, 1, std::max<int64_t>(1, num_threads)));
  // Items are numbered in bank order, so a chunk of consecutive items is one contiguous slab of
  // an expert's rows: long sequential streams for the prefetchers. Decode: a few chunks per
  // thread (dynamic, so a thread the OS preempts does not hold the others up). Prefill: experts
  // differ in token counts, so items are handed out one by one.
  int64_t longest_run = 0;
  for (int64_t run = 0; run < num_runs; ++run) longest_run = std::max(longest_run, run_start[run + 1] - run_start[run]);
  const int64_t chunks = longest_run <= MAX_NT ? 4 * threads : gate_items + down_items;
  const int64_t gate_chunk = std::max<int64_t>(1, gate_items / chunks);
  const int64_t down_chunk = std::max<int64_t>(1, down_items / chunks);

  // tokens a pass over a row takes: a gate item's rows are gate's and up's
  const int gate_nt = std::min(gated ? gate_dots.max_nt() : PASS_NT, up_dots.max_nt()), down_nt = down_dots.max_nt();
#pragma omp parallel num_threads(threads)
  {
    Acts xa;
    float ra[PASS_NT], rb[PASS_NT], rc[PASS_NT], rd[PASS_NT];
    // 0. the tokens as Q8_K (K-quant gate or up only), as int8 rows (int8 MXFP4 gate or up only)
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_tokens * x_blocks; ++b) kq::quantize_q8k(x + b * kq::QK_K, kq::QK_K, xq + b);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (xm_bytes ? num_tokens : 0); ++t) mx::quantize_row(x + t * hidden, hidden, xm + t * xm_bytes);
    // 1. h[pair, r] = act(gate_r . x + bias, up_r . x + bias); items: (expert, 16 rows of gate and of up)
#pragma omp for schedule(dynamic, gate_chunk)
    for (int64_t item = 0; item < gate_items; ++item) {
      const int64_t per_run = gate_items / num_runs, run = item / per_run, r0 = item % per_run * ROWS_PER_ITEM;
      const int64_t r1 = std::min(r0 + ROWS_PER_ITEM, inter);
      const uint8_t* record = bank + ids[order[run_start[run]]] * L.record_stride;
      for (int64_t r = r0; r < r1; r += fused ? 1 : 2) {
        const int64_t r2 = std::min(r + 1, r1 - 1);  // unfused: an odd last row is paired with itself
        const uint8_t* g = record + L.gate.offset + r * L.gate.row_bytes;
        const uint8_t* u = record + L.up.offset + r * L.up.row_bytes;
        const float bg = bias_at(record, L.gate_bias, L.bias_dtype, r), bu = bias_at(record, L.up_bias, L.bias_dtype, r);
        const float bg2 = bias_at(record, L.gate_bias, L.bias_dtype, r2);
        const float bu2 = bias_at(record, L.up_bias, L.bias_dtype, r2);
        for (int64_t i = run_start[run]; i < run_start[run + 1]; i += gate_nt) {
          const int nt = int(std::min<int64_t>(gate_nt, run_start[run + 1] - i));
          for (int t = 0; t < nt; ++t) {
            const int64_t tok = pair_token[order[i + t]];
            xa.f[t] = x + tok * hidden;
            xa.k[t] = xq + tok * x_blocks;
            xa.m[t] = xm + tok * xm_bytes;
          }
          if (!gated) {  // rb, rd: up rows r, r2
            up_dots(nt, u, record + L.up.offset + r2 * L.up.row_bytes, scale_row(record, L.up, r),
                    scale_row(record, L.up, r2), L.up, xa, rb, rd);
            for (int t = 0; t < nt; ++t) {
              h[(i + t) * inter + r2] = act(0.f, rd[t] + bu2);
              h[(i + t) * inter + r] = act(0.f, rb[t] + bu);
            }
            continue;
          }
          if (fused) {
            gate_dots(nt, g, u, scale_row(record, L.gate, r), scale_row(record, L.up, r), L.gate, xa, ra, rb);
          } else {  // ra, rc: gate rows r, r2; rb, rd: up rows r, r2
            gate_dots(nt, g, record + L.gate.offset + r2 * L.gate.row_bytes, scale_row(record, L.gate, r),
                      scale_row(record, L.gate, r2), L.gate, xa, ra, rc);
            up_dots(nt, u, record + L.up.offset + r2 * L.up.row_bytes, scale_row(record, L.up, r),
                    scale_row(record, L.up, r2), L.up, xa, rb, rd);
            for (int t = 0; t < nt; ++t) h[(i + t) * inter + r2] = act(rc[t] + bg2, rd[t] + bu2);
          }
          for (int t = 0; t < nt; ++t) h[(i + t) * inter + r] = act(ra[t] + bg, rb[t] + bu);
        }
      }
    }
    // 1b. h as Q8_K (a K-quant down only) or int8 rows (an int8 MXFP4 down only), each pair's row once
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_pairs * h_blocks; ++b) kq::quantize_q8k(h + b * kq::QK_K, kq::QK_K, hq + b);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < (hm_bytes ? num_pairs : 0); ++i) mx::quantize_row(h + i * inter, inter, hm + i * hm_bytes);
    // 2. y[pair, r] = down_r . h[pair] + bias; items: (expert, 16 rows of down), two rows per pass
#pragma omp for schedule(dynamic, down_chunk)
    for (int64_t item = 0; item < down_items; ++item) {
      const int64_t per_run = down_items / num_runs, run = item / per_run, r0 = item % per_run * ROWS_PER_ITEM;
      const int64_t r1 = std::min(r0 + ROWS_PER_ITEM, hidden);
      const uint8_t* record = bank + ids[order[run_start[run]]] * L.record_stride;
      for (int64_t r = r0; r < r1; r += 2) {
        const int64_t r2 = std::min(r + 1, r1 - 1);  // an odd last row is paired with itself
        const uint8_t* a = record + L.down.offset + r * L.down.row_bytes;
        const uint8_t* b = record + L.down.offset + r2 * L.down.row_bytes;
        const float ba = bias_at(record, L.down_bias, L.bias_dtype, r);
        const float bb = bias_at(record, L.down_bias, L.bias_dtype, r2);
        for (int64_t i = run_start[run]; i < run_start[run + 1]; i += down_nt) {
          const int nt = int(std::min<int64_t>(down_nt, run_start[run + 1] - i));
          for (int t = 0; t < nt; ++t) {
            xa.f[t] = h + (i + t) * inter;
            xa.k[t] = hq + (i + t) * h_blocks;
            xa.m[t] = hm + (i + t) * hm_bytes;
          }
          down_dots(nt, a, b, scale_row(record, L.down, r), scale_row(record, L.down, r2), L.down, xa, ra, rb);
          for (int t = 0; t < nt; ++t) {
            y[(i + t) * hidden + r] = ra[t] + ba;
            y[(i + t) * hidden + r2] = rb[t] + bb;
          }
        }
      }
    }
    // 3. out[t] = sum over t's pairs p of weights[p] * y[p], in pair order (deterministic)
#pragma omp for schedule(static)
    for (int64_t item = 0; item < sum_items; ++item) {
      const int64_t per_token = sum_items / num_tokens, t = item / per_token, r0 = item % per_token * SUM_ROWS;
      const int64_t n = std::min(SUM_ROWS, hidden - r0);
      float* o = out + t * hidden + r0;
      std::fill(o, o + n, 0.f);
      for (int64_t p = token_start[t]; p < token_start[t + 1]; ++p) {
        const float wk = weights[p];
        const float* yk = y + position[p] * hidden + r0;
        for (int64_t r = 0; r < n; ++r) o[r] += wk * yk[r];
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" {

int ft_moe_version() { return 9; }

int ft_moe_simd_width() { return W; }

// out[T, H] = sum_k weights[t, k] * expert_{ids[t, k]}(x[t]), every tensor fp32 and contiguous.
// Returns 0, -1 for an expert id out of range, -2 for an unsupported dtype.
int ft_moe_forward(const uint8_t* bank, const Layout* layout, int64_t num_tokens, int64_t top_k, const int64_t* ids,
                   const float* weights, const float* x, float* out, int64_t num_threads) {
  const int64_t num_pairs = num_tokens * top_k;
  std::vector<int64_t> pair_token(num_pairs), token_start(num_tokens + 1);
  for (int64_t p = 0; p < num_pairs; ++p) pair_token[p] = p / top_k;
  for (int64_t t = 0; t <= num_tokens; ++t) token_start[t] = t * top_k;
  return moe_pairs(bank, *layout, num_tokens, num_pairs, ids, pair_token.data(), token_start.data(), weights, x, out,
                   num_threads);
}

// The CPU's share of a hybrid decode call, selection and all, so the worker thread runs no torch
// op: out[T, H] (fp32) = sum over the pairs (t, k) whose expert the route plan marked `code`
// (status[inverse[t, k]] == code) of weights[t, k] * expert_{ids[t, k]}(x[t]). x and weights
// in `x_dtype` / `w_dtype` (F32, F16 or BF16), ids int64 (or int32 when ids_int32), status [*]
// and inverse [T, K] int32, all contiguous. Returns 0, -1 for an expert id out of range, -2 for
// an unsupported dtype.
int ft_moe_forward_selected(const uint8_t* bank, const Layout* layout, int64_t num_tokens, int64_t top_k,
                            const void* ids, int64_t ids_int32, const int32_t* status, const int32_t* inverse,
                            int32_t code, const void* weights, int64_t w_dtype, const void* x, int64_t x_dtype,
                            float* out, int64_t num_threads) {
  const int64_t hidden = layout->gate.cols, all_pairs = num_tokens * top_k;
  std::vector<float> xf(static_cast<size_t>(num_tokens * hidden)), wf(static_cast<size_t>(all_pairs));
  if (!to_floats(x_dtype, x, num_tokens * hidden, xf.data()) || !to_floats(w_dtype, weights, all_pairs, wf.data()))
    return -2;
  std::vector<int64_t> sel_ids, sel_token, token_start(num_tokens + 1, 0);
  std::vector<float> sel_w;
  for (int64_t t = 0; t < num_tokens; ++t) {
    token_start[t] = int64_t(sel_ids.size());
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t p = t * top_k + k;
      if (status[inverse[p]] != code) continue;
      sel_ids.push_back(ids_int32 ? int64_t(static_cast<const int32_t*>(ids)[p]) : static_cast<const int64_t*>(ids)[p]);
      sel_token.push_back(t);
      sel_w.push_back(wf[p]);
    }
  }
  token_start[num_tokens] = int64_t(sel_ids.size());
  return moe_pairs(bank, *layout, num_tokens, int64_t(sel_ids.size()), sel_ids.data(), sel_token.data(),
                   token_start.data(), sel_w.data(), xf.data(), out, num_threads);
}

// out[T, rows] = x[T, cols] . w[rows, cols]^T for a dense weight matrix (f32, f16 or bf16, no
// scales), T <= 4: decode's projections and the LM head, streamed once at DRAM speed (torch's
// GEMV reads a large bf16 matrix at about half of it). Also K-quant rows (Q4_K, Q5_K, Q6_K,
// cols a multiple of 256) against x as Q8_K, MXFP4 rows (cols a multiple of 32) against x as
// int8 rows, as the expert kernel computes them (MXFP4: with `mxfp4_int8`), and Q8_0 rows (cols
// a multiple of 32) against x itself, as the expert kernel's Q8_0 products. fp32 x and out,
// contiguous. Returns 0, -2 for an unsupported dtype or T.
int ft_dense_forward(const uint8_t* w, int64_t dtype, int64_t rows, int64_t cols, int64_t num_tokens,
                     const float* x, float* out, int64_t num_threads) {
  if (num_tokens < 1 || num_tokens > MAX_NT || dtype == E4M3 || dtype == E5M2) return -2;
  if (dtype == Q8_0 && cols % 32 != 0) return -2;
  const bool kquant = kq::is_kquant(dtype), mxfp4 = dtype == MXFP4;
  const int64_t row_bytes = kquant ? cols / kq::QK_K * kq::block_bytes(dtype)
                            : mxfp4 ? cols / mx::QK * mx::BLOCK_BYTES
                            : dtype == Q8_0 ? cols / 32 * 34 : cols * elem_bytes(dtype);
  Mat m{0, row_bytes, dtype, rows, cols, -1, 0, 1, 1};
  RowDots dots;
  if (!dots.bind(m, true)) return -2;
  const int64_t x_blocks = kquant ? cols / kq::QK_K : 0, xm_bytes = mxfp4 ? mx::act_row_bytes(cols) : 0;
  std::vector<kq::Q8K> xq(size_t(num_tokens * x_blocks));
  std::vector<uint8_t> xm(size_t(num_tokens * xm_bytes));
  if (kquant) kq::quantize_q8k(x, num_tokens * cols, xq.data());
  Acts xa;
  for (int t = 0; t < num_tokens; ++t) {
    if (mxfp4) mx::quantize_row(x + t * cols, cols, xm.data() + t * xm_bytes);
    xa.f[t] = x + t * cols;
    xa.k[t] = xq.data() + t * x_blocks;
    xa.m[t] = xm.data() + t * xm_bytes;
  }
  const int threads = int(std::clamp<int64_t>((rows * m.row_bytes) >> 16, 1, std::max<int64_t>(1, num_threads)));
  // Each thread takes a contiguous share of the rows and walks its two halves side by side: the
  // two rows of a pass come from two streams far apart, which the core's prefetchers keep ahead
  // together (as the expert kernel's gate and up rows are); adjacent rows were one stream, at
  // ~2/3 of the rate a thread reached with two.
#pragma omp parallel num_threads(threads)
  {
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t lo = rows * id / n, hi = rows * (id + 1) / n, half = (hi - lo + 1) / 2;
    float ra[MAX_NT], rb[MAX_NT];
    for (int64_t r = lo; r < lo + half; ++r) {
      const int64_t r2 = r + half < hi ? r + half : r;  // an odd share's middle row is paired with itself
      dots(int(num_tokens), w + r * m.row_bytes, w + r2 * m.row_bytes, nullptr, nullptr, m, xa, ra, rb);
      for (int t = 0; t < num_tokens; ++t) {
        out[t * rows + r] = ra[t];
        out[t * rows + r2] = rb[t];
      }
    }
  }
  return 0;
}

// One expert's weights as bf16: w13 [2I, H] (gate rows, then up rows; [I, H], the up rows,
// where not gated) and w2 [H, I], for
// prefill's one-GEMM-per-expert path on quantized banks. Returns 0, -1 for an expert out of
// range, -2 for an unsupported dtype.
int ft_dequant_expert(const uint8_t* bank, const Layout* layout, int64_t expert, uint16_t* w13, uint16_t* w2,
                      int64_t num_threads) {
  const Layout& L = *layout;
  if (expert < 0 || expert >= L.num_experts) return -1;
  RowDots supported;  // the dtypes the kernel reads are the ones it dequantizes
  if (!supported.bind(L.gate) || !supported.bind(L.up) || !supported.bind(L.down)) return -2;
  const uint8_t* record = bank + expert * L.record_stride;
  const bool gated = gated_kind(L.activation);
  const Mat* mats[3] = {&L.gate, &L.up, &L.down};
  uint16_t* outs[3] = {w13, w13 + (gated ? L.gate.rows * L.gate.cols : 0), w2};
  int64_t first_item[4] = {0, 0, 0, 0};
  for (int k = 0; k < 3; ++k)  // (no gate rows where not gated: up's are w13's)
    first_item[k + 1] = first_item[k] + (k == 0 && !gated ? 0 : (mats[k]->rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM);
  const int64_t expert_bytes =
      L.up.rows * ((gated ? L.gate.row_bytes : 0) + L.up.row_bytes) + L.down.rows * L.down.row_bytes;
  const int threads = int(std::clamp<int64_t>(expert_bytes >> 16, 1, std::max<int64_t>(1, num_threads)));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < first_item[3]; ++item) {
    const int k = item < first_item[1] ? 0 : item < first_item[2] ? 1 : 2;
    const Mat& m = *mats[k];
    const int64_t r0 = (item - first_item[k]) * ROWS_PER_ITEM;
    dequant_rows_of(m.dtype, record, m, r0, std::min(r0 + ROWS_PER_ITEM, m.rows), outs[k]);
  }
  return 0;
}

// One row of a K-quant, MXFP4 or Q8_0 matrix as fp32: gguf-py's values bit for bit (Q8_0's
// d x q is exact in fp32).
void dequant_row_f32(int64_t dtype, const uint8_t* row, int64_t cols, float* out) {
  if (dtype == MXFP4) {
    mx::dequant_row(row, cols, out);
  } else if (dtype == Q8_0) {  // blocks of 34 bytes: fp16 scale d, 32 int8; weight = d x q
    for (int64_t c = 0, blk = 0; c < cols; c += 32, blk += 34) {
      uint16_t d;
      std::memcpy(&d, row + blk, 2);
      const float scale = half_to_float(d);
      for (int k = 0; k < 32; ++k) out[c + k] = scale * float(int8_t(row[blk + 2 + k]));
    }
  } else {
    kq::dequant_row(dtype, row, cols, out);
  }
}

// Rows of a K-quant, MXFP4 or Q8_0 matrix as fp32 (out_dtype F32), bit for bit gguf-py's
// gguf.quants.dequantize (the values the kernel's products stand for; the tests hold it to that
// oracle), or those values rounded to bf16 (BF16: as torch's .to(torch.bfloat16) rounds them, by
// the expert dequantizer's dequant_rows_of), the rows split over `num_threads`: a CPU prompt's
// product with a GGUF file's dense weights dequantizes them a chunk of rows at a time
// (layers/block_weight.py). Returns 0, -2 for another dtype or rows of partial blocks.
int ft_dequant_rows(const uint8_t* rows, int64_t dtype, int64_t num_rows, int64_t cols, void* out, int64_t out_dtype,
                    int64_t num_threads) {
  const bool mxfp4 = dtype == MXFP4, q8_0 = dtype == Q8_0;
  if (!(mxfp4 || q8_0 || kq::is_kquant(dtype)) || (out_dtype != F32 && out_dtype != BF16)) return -2;
  if (cols % (mxfp4 ? mx::QK : q8_0 ? 32 : kq::QK_K) != 0) return -2;
  const int64_t row_bytes = mxfp4 ? cols / mx::QK * mx::BLOCK_BYTES
                            : q8_0 ? cols / 32 * 34 : cols / kq::QK_K * kq::block_bytes(dtype);
  const Mat m{0, row_bytes, dtype, num_rows, cols, -1, 0, 1, 1};
  const int threads = num_rows * cols >= (1 << 16) ? int(std::max<int64_t>(1, num_threads)) : 1;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < num_rows; ++r) {
    if (out_dtype == BF16)
      dequant_rows_of(dtype, rows, m, r, r + 1, static_cast<uint16_t*>(out));
    else
      dequant_row_f32(dtype, rows + r * row_bytes, cols, static_cast<float*>(out) + r * cols);
  }
  return 0;
}

// Decode attention of one query token over `length` cached positions, grouped-query: q [Hq, dim]
// fp32 with Hq = kv_heads x group; keys/values f32, f16 or bf16 at element strides st = {k per
// position, k per head, v per position, v per head} (unit stride within a head); out [Hq, v_dim]
// fp32 = softmax(q . k x scale) . v, the softmax in fp32. Positions are split in spans across
// threads (each span's partial softmax, then combined), each read front to back once: 8-9 GB/s
// on the 2-core VM at any length, where torch's small-M bf16 matmuls reached 1-5 GB/s. Returns 0,
// or -2 for an unsupported dtype.
int ft_decode_attention(const uint8_t* k, const uint8_t* v, int64_t dtype, int64_t length, int64_t kv_heads,
                        int64_t group, int64_t dim, int64_t v_dim, const int64_t* strides, const float* q, float scale,
                        float* out, int64_t num_threads) {
  AttendSpan span;
  switch (dtype) {
    case F32: span = attend_span<F32>; break;
    case F16: span = attend_span<F16>; break;
    case BF16: span = attend_span<BF16>; break;
    default: return -2;
  }
  const int threads = int(std::max<int64_t>(1, num_threads));
  const int64_t heads = kv_heads * group;
  const int64_t spans = std::clamp<int64_t>(length / 64, 1, 4 * int64_t(threads));
  const int64_t per_span = (length + spans - 1) / spans;
  std::vector<float> ms(size_t(spans * heads)), ss(size_t(spans * heads)), accs(size_t(spans * heads * v_dim));
#pragma omp parallel for schedule(static) num_threads(int(std::min<int64_t>(threads, spans)))
  for (int64_t c = 0; c < spans; ++c) {
    const int64_t l0 = c * per_span;
    span(k, v, strides, kv_heads, group, dim, v_dim, q, scale, l0, std::min(length, l0 + per_span),
         ms.data() + c * heads, ss.data() + c * heads, accs.data() + c * heads * v_dim);
  }
  for (int64_t g = 0; g < heads; ++g) {
    float top = -INFINITY;
    for (int64_t c = 0; c < spans; ++c) top = std::max(top, ms[c * heads + g]);
    float* o = out + g * v_dim;
    std::fill(o, o + v_dim, 0.f);
    float total = 0.f;
    for (int64_t c = 0; c < spans; ++c) {
      const int64_t at = c * heads + g;
      if (ss[at] == 0.f) continue;  // an empty span
      const float w = std::exp(ms[at] - top);
      total += ss[at] * w;
      const float* a = accs.data() + at * v_dim;
      for (int64_t i = 0; i < v_dim; ++i) o[i] += a[i] * w;
    }
    for (int64_t i = 0; i < v_dim; ++i) o[i] /= total;
  }
  return 0;
}

// Sum of a buffer's bytes as uint64 words, split over threads like the kernel: the DRAM read
// ceiling the kernel is measured against (same threads, same OpenMP runtime).
uint64_t ft_read_bytes(const uint8_t* data, int64_t nbytes, int64_t num_threads) {
  const int64_t words = nbytes / 64;
  uint64_t total = 0;
#pragma omp parallel for schedule(static) num_threads(int(std::max<int64_t>(1, num_threads))) reduction(^ : total)
  for (int64_t i = 0; i < words; ++i) {
#if FT_PREFETCH > 0 && defined(__SSE__)
    _mm_prefetch(reinterpret_cast<const char*>(data + i * 64) + FT_PREFETCH, FT_PREFETCH_HINT);  // as the kernel
#endif
    const uint64_t* w = reinterpret_cast<const uint64_t*>(data + i * 64);
    total ^= w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4] ^ w[5] ^ w[6] ^ w[7];
  }
  return total;
}

}  // extern "C"

// One decode call's CPU share for the share worker: the arguments of ft_moe_forward_selected,
// and the call's hand-over flags (see ShareWorker).
struct ShareJob {
  const uint8_t* bank;
  Layout layout;
  int64_t num_tokens, top_k;
  const void* ids;
  int64_t ids_int32;
  const int32_t* status;
  const int32_t* inverse;
  int32_t code;
  const void* weights;
  int64_t w_dtype;
  const void* x;
  int64_t x_dtype;
  float* out;
  int64_t num_threads;
  volatile uint32_t* ready;  // set to 1 when the job's inputs are in place (by the GPU stream); cleared here
  volatile uint32_t* done;   // set to 1 here when `out` holds the result, or the job failed
  int64_t timeout_us;        // the longest wait for `ready`
};

int wait_u32(const volatile uint32_t* flag, uint32_t value, int64_t timeout_us);

// The hybrid runtime's CPU-share worker: a thread of its own that takes decode calls' jobs in
// order, waits for each one's `ready`, runs it and sets `done`, and never holds Python's GIL.
// A Python worker needs the GIL after each wait and before each `done`, and the thread that
// launches the GPU work holds it most of the time: on the H200 host every hand-over waited
// ~0.1 ms for it, twice a layer, while the GPU waited for `done`.
struct ShareWorker {
  std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<ShareJob> jobs;
  int64_t pending = 0;  // pushed and not yet finished
  bool stop = false;
  std::atomic<int> error{0};  // the first failure's code: -1 expert id out of range, -2 dtype, -3 no `ready`
  std::atomic<int64_t> busy_ns{0};  // time in the kernel
  std::thread thread;

  void run() {
    for (;;) {
      ShareJob job;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;  // stop, and nothing left
        job = jobs.front();
        jobs.pop_front();
      }
      int rc = -3;
      if (wait_u32(job.ready, 1, job.timeout_us) == 0) {
        std::atomic_thread_fence(std::memory_order_acquire);  // the staged inputs after `ready`
        *job.ready = 0;
        const auto start = std::chrono::steady_clock::now();
        rc = ft_moe_forward_selected(job.bank, &job.layout, job.num_tokens, job.top_k, job.ids, job.ids_int32,
                                     job.status, job.inverse, job.code, job.weights, job.w_dtype, job.x, job.x_dtype,
                                     job.out, job.num_threads);
        busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                       .count();
      }
      if (rc != 0) {
        int none = 0;
        error.compare_exchange_strong(none, rc);
      }
      std::atomic_thread_fence(std::memory_order_release);  // `out` before `done`
      *job.done = 1;  // always: the GPU stream is waiting for it
      {
        std::lock_guard<std::mutex> lock(mu);
        --pending;
      }
      idle.notify_all();
    }
  }
};

extern "C" {

void* ft_share_open() {
  auto* w = new ShareWorker();
  w->thread = std::thread([w] { w->run(); });
  return w;
}

// Queues one job (copied) behind the earlier ones. Returns the first failure so far (0: none).
int ft_share_push(void* handle, const ShareJob* job) {
  auto* w = static_cast<ShareWorker*>(handle);
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->jobs.push_back(*job);
    ++w->pending;
  }
  w->wake.notify_one();
  return w->error.load();
}

// Waits until every queued job has finished, up to timeout_us. Returns 0, or 1 on timeout.
int ft_share_drain(void* handle, int64_t timeout_us) {
  auto* w = static_cast<ShareWorker*>(handle);
  std::unique_lock<std::mutex> lock(w->mu);
  return w->idle.wait_for(lock, std::chrono::microseconds(timeout_us), [&] { return w->pending == 0; }) ? 0 : 1;
}

// The first failure's code, and clears it (0: none).
int ft_share_error(void* handle) { return static_cast<ShareWorker*>(handle)->error.exchange(0); }

int64_t ft_share_busy_ns(void* handle) { return static_cast<ShareWorker*>(handle)->busy_ns.load(); }

// Finishes the queued jobs (each waits for its `ready` up to its timeout), stops the thread, frees it.
void ft_share_close(void* handle) {
  auto* w = static_cast<ShareWorker*>(handle);
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->stop = true;
  }
  w->wake.notify_one();
  w->thread.join();
  delete w;
}

// Waits until *flag == value, a store by another agent (the GPU over PCIe, or a thread): the CPU
// share's worker waiting for a decode call's inputs. Looks with a pause between looks; after
// ~20 us it also yields the core every 1024 looks. Returns 0, or 1 after timeout_us. Called
// through ctypes, so with the GIL released.
int ft_wait_u32(const volatile uint32_t* flag, uint32_t value, int64_t timeout_us) {
  return wait_u32(flag, value, timeout_us);
}

}  // extern "C"

int wait_u32(const volatile uint32_t* flag, uint32_t value, int64_t timeout_us) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (int64_t spin = 0;; ++spin) {
    if (*flag == value) return 0;
    if ((spin & 1023) == 1023) {
      const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - start).count();
      if (waited >= timeout_us) return 1;
      if (waited >= 20) sched_yield();
    }
#if defined(__SSE__)
    _mm_pause();
#endif
  }
}
