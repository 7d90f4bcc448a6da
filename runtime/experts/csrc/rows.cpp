// Row-wise small ops of a decode step on the CPU: RMSNorm and the rotary embedding. torch runs one
// norm as about eight small ops (cast, pow, mean, add, rsqrt, mul, cast, mul) and one rotation as
// about seven (slices, two products, a negation, a concatenation, a sum), each costing more in
// dispatch than in arithmetic: ~15-20 us a 2,048-value row on the 2-core VM, where a Qwen3-30B-A3B
// token takes four norms and two rotations a layer. Here each is one call, the same arithmetic in
// the same steps as runtime/layers/norm.py's and rope.py's torch forms (the build has
// -ffp-contract=off: nothing fused; a bf16 product or sum rounded to bf16 where torch's bf16 op
// rounds it): the rotation is torch's bit for bit; the norm adds its squares in another order (16
// lanes, then across), so a result may differ from torch's in the last bit of the scale.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fp16.h"

namespace {

enum Dtype : int64_t { F32 = 0, BF16 = 2 };  // the codes of enum Dtype in moe_cpu.cpp

template <int64_t D> using Elem = std::conditional_t<D == F32, float, uint16_t>;

template <int64_t D> inline float widen(Elem<D> v) {
  if constexpr (D == F32) return v;
  else return bits_to_float(uint32_t(v) << 16);
}

// fp16.h's float_to_bf16 without its branch, so that a row's loop vectorizes (the same values)
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

template <int64_t D> inline Elem<D> narrow(float v) {
  if constexpr (D == F32) return v;
  else return to_bf16(v);
}

// What torch's D-typed round trip makes of a float32 value (h.to(dtype) read back as float).
template <int64_t D> inline float round_to(float v) { return widen<D>(narrow<D>(v)); }

// One row: h = x as float32, r = 1 / sqrt(mean(h^2) + eps), then
//   no weight:  out = D(h r)                          (l2_norm)
//   offset 0:   out = D(w x float(D(h r)))            (weight * h.to(dtype): the product rounded to D)
//   offset o:   out = D(h r x (o + float(w)))         ((h * (offset + weight.float())).to(dtype))
template <int64_t D> void norm_row(const Elem<D>* __restrict x, const Elem<D>* __restrict weight, int64_t cols,
                                   float eps, float offset, Elem<D>* __restrict out) {
  float lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int j = 0; j < 16; ++j) {
      const float h = widen<D>(x[c + j]);
      lanes[j] += h * h;
    }
  float sum = 0.f;
  for (float lane : lanes) sum += lane;
  for (; c < cols; ++c) {
    const float h = widen<D>(x[c]);
    sum += h * h;
  }
  const float r = 1.f / std::sqrt(sum / float(cols) + eps);
  if (weight == nullptr) {
    for (int64_t i = 0; i < cols; ++i) out[i] = narrow<D>(widen<D>(x[i]) * r);
  } else if (offset != 0.f) {
    for (int64_t i = 0; i < cols; ++i) out[i] = narrow<D>(widen<D>(x[i]) * r * (offset + widen<D>(weight[i])));
  } else {
    for (int64_t i = 0; i < cols; ++i) out[i] = narrow<D>(widen<D>(weight[i]) * round_to<D>(widen<D>(x[i]) * r));
  }
}

template <int64_t D> void norm_rows(const void* x, int64_t rows, int64_t cols, const void* weight, float eps,
                                    float offset, void* out, int threads) {
  const auto* in = static_cast<const Elem<D>*>(x);
  const auto* w = static_cast<const Elem<D>*>(weight);
  auto* o = static_cast<Elem<D>*>(out);
  if (threads <= 1) {  // (no OpenMP region: a decode row takes about a microsecond)
    for (int64_t r = 0; r < rows; ++r) norm_row<D>(in + r * cols, w, cols, eps, offset, o + r * cols);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) norm_row<D>(in + r * cols, w, cols, eps, offset, o + r * cols);
}

// One head rotated as transformers' rotate_half pairs its channels: i and i + R/2 of the first R,
// with cos/sin [R] (each angle twice, as RotaryEmbedding's tables), each product and the sum
// rounded to D as torch's D-typed ops are; channels R.. copied.
template <int64_t D> void rotate_head(const Elem<D>* __restrict x, int64_t dim, const Elem<D>* __restrict cos,
                                      const Elem<D>* __restrict sin, int64_t rot, Elem<D>* __restrict out) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = widen<D>(x[i]), b = widen<D>(x[i + half]);
    out[i] = narrow<D>(round_to<D>(a * widen<D>(cos[i])) + round_to<D>(-b * widen<D>(sin[i])));
    out[i + half] = narrow<D>(round_to<D>(b * widen<D>(cos[i + half])) + round_to<D>(a * widen<D>(sin[i + half])));
  }
  for (int64_t i = rot; i < dim; ++i) out[i] = x[i];
}

template <int64_t D> void rotate(const void* x, int64_t tokens, int64_t heads, int64_t dim, const void* cos,
                                 const void* sin, int64_t rot, void* out, int threads) {
  const auto* in = static_cast<const Elem<D>*>(x);
  const auto *c = static_cast<const Elem<D>*>(cos), *s = static_cast<const Elem<D>*>(sin);
  auto* o = static_cast<Elem<D>*>(out);
  const auto token = [&](int64_t t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = (t * heads + h) * dim;
      rotate_head<D>(in + at, dim, c + t * rot, s + t * rot, rot, o + at);
    }
  };
  if (threads <= 1) {  // (a decode step: no OpenMP region)
    for (int64_t t = 0; t < tokens; ++t) token(t);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < tokens; ++t) token(t);
}

}  // namespace

extern "C" {

// rows x cols values of `dtype` (F32 or BF16) at x, contiguous, each row RMS-normed into out (the
// same layout and dtype), times `weight` (cols values of the same dtype, or null: none) as above.
// 0, or -2 for another dtype.
int ft_rms_norm(const void* x, int64_t dtype, int64_t rows, int64_t cols, const void* weight, float eps, float offset,
                void* out, int64_t num_threads) {
  const int threads = rows * cols >= (1 << 16) ? int(num_threads > 0 ? num_threads : 1) : 1;
  switch (dtype) {
    case F32: norm_rows<F32>(x, rows, cols, weight, eps, offset, out, threads); return 0;
    case BF16: norm_rows<BF16>(x, rows, cols, weight, eps, offset, out, threads); return 0;
    default: return -2;
  }
}

// x [tokens, heads, dim] of `dtype` (F32 or BF16), contiguous, rotated into out (the same layout):
// token t's first `rot` channels of each head by cos/sin [tokens, rot] (x's dtype, contiguous) as
// layers/rope.apply_rotary does, the rest copied; a prompt's tokens over `num_threads`. 0, or -2
// for another dtype.
int ft_rotary(const void* x, int64_t dtype, int64_t tokens, int64_t heads, int64_t dim, const void* cos,
              const void* sin, int64_t rot, void* out, int64_t num_threads) {
  const int threads = tokens * heads * dim >= (1 << 16) ? int(num_threads > 0 ? num_threads : 1) : 1;
  switch (dtype) {
    case F32: rotate<F32>(x, tokens, heads, dim, cos, sin, rot, out, threads); return 0;
    case BF16: rotate<BF16>(x, tokens, heads, dim, cos, sin, rot, out, threads); return 0;
    default: return -2;
  }
}

}  // extern "C"
