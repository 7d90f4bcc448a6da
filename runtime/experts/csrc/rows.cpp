// Row-wise small ops of a decode step on the CPU: RMSNorm. torch runs one norm as about eight
// small ops (cast, pow, mean, add, rsqrt, mul, cast, mul), each costing more in dispatch than in
// arithmetic: ~20 us a 2,048-value row on the 2-core VM, and a Qwen3-30B-A3B token takes 4 norms a
// layer. Here it is one call, the same arithmetic in the same float32 steps as
// runtime/layers/norm.py's torch form (the build has -ffp-contract=off: nothing fused); only the
// sum of squares adds in another order (16 lanes, then across), so a result may differ from
// torch's in the last bit of the scale.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fp16.h"

namespace {

enum Dtype : int64_t { F32 = 0, BF16 = 2 };  // the codes of enum Dtype in moe_cpu.cpp

template <int64_t D> inline float load(const void* p, int64_t i) {
  if constexpr (D == F32) return static_cast<const float*>(p)[i];
  else return bits_to_float(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
}

// fp16.h's float_to_bf16 without its branch, so that a row's loop vectorizes (the same values)
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

template <int64_t D> inline void store(void* p, int64_t i, float v) {
  if constexpr (D == F32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = to_bf16(v);
}

// What torch's D-typed round trip makes of a float32 value (h.to(dtype) read back as float).
template <int64_t D> inline float round_to(float v) {
  if constexpr (D == F32) return v;
  else return bits_to_float(uint32_t(to_bf16(v)) << 16);
}

// One row: h = x as float32, r = 1 / sqrt(mean(h^2) + eps), then
//   no weight:  out = D(h r)                          (l2_norm)
//   offset 0:   out = D(w x float(D(h r)))            (weight * h.to(dtype): the product rounded to D)
//   offset o:   out = D(h r x (o + float(w)))         ((h * (offset + weight.float())).to(dtype))
template <int64_t D> void norm_row(const void* x, const void* weight, int64_t cols, float eps, float offset, void* out) {
  float lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16)
    for (int j = 0; j < 16; ++j) {
      const float h = load<D>(x, c + j);
      lanes[j] += h * h;
    }
  float sum = 0.f;
  for (float lane : lanes) sum += lane;
  for (; c < cols; ++c) {
    const float h = load<D>(x, c);
    sum += h * h;
  }
  const float r = 1.f / std::sqrt(sum / float(cols) + eps);
  if (weight == nullptr) {
    for (int64_t i = 0; i < cols; ++i) store<D>(out, i, load<D>(x, i) * r);
  } else if (offset != 0.f) {
    for (int64_t i = 0; i < cols; ++i) store<D>(out, i, load<D>(x, i) * r * (offset + load<D>(weight, i)));
  } else {
    for (int64_t i = 0; i < cols; ++i) store<D>(out, i, load<D>(weight, i) * round_to<D>(load<D>(x, i) * r));
  }
}

template <int64_t D> void norm_rows(const uint8_t* x, int64_t rows, int64_t cols, const void* weight, float eps,
                                    float offset, uint8_t* out, int threads) {
  const int64_t bytes = cols * (D == F32 ? 4 : 2);
  if (threads <= 1) {  // (no OpenMP region: a decode row takes about a microsecond)
    for (int64_t r = 0; r < rows; ++r) norm_row<D>(x + r * bytes, weight, cols, eps, offset, out + r * bytes);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) norm_row<D>(x + r * bytes, weight, cols, eps, offset, out + r * bytes);
}

}  // namespace

extern "C" {

// rows x cols values of `dtype` (F32 or BF16) at x, contiguous, each row RMS-normed into out (the
// same layout and dtype), times `weight` (cols values of the same dtype, or null: none) as above.
// 0, or -2 for another dtype.
int ft_rms_norm(const void* x, int64_t dtype, int64_t rows, int64_t cols, const void* weight, float eps, float offset,
                void* out, int64_t num_threads) {
  const int threads = rows * cols >= (1 << 16) ? int(num_threads > 0 ? num_threads : 1) : 1;
  const auto* in = static_cast<const uint8_t*>(x);
  auto* o = static_cast<uint8_t*>(out);
  switch (dtype) {
    case F32: norm_rows<F32>(in, rows, cols, weight, eps, offset, o, threads); return 0;
    case BF16: norm_rows<BF16>(in, rows, cols, weight, eps, offset, o, threads); return 0;
    default: return -2;
  }
}

}  // extern "C"
