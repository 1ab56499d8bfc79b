// Vector helpers shared by the native kernels: 16 float lanes (GCC vector extensions, which
// compile to AVX-512, or to two AVX2 registers a vector), a vectorised exp, lane reductions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/util/BFloat16.h>

namespace transduce_vec {

constexpr int kLanes = 16;
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kLanes * sizeof(int32_t))));
constexpr float kInf = std::numeric_limits<float>::infinity();

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

inline vf splat(float x) { return vf{} + x; }

// exp(x) for x <= 0 (x - max): Cephes' expf, inputs below -87 give exp(-87) ~ 1.6e-38, nothing
// next to the max's term 1
inline vf exp_nonpositive(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  const vf shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf t = x * splat(1.44269504088896341f) + shifter;
  vf n = t - shifter;
  vi bits;
  std::memcpy(&bits, &t, sizeof bits);
  vi ni = bits - 0x4B400000;  // n as an integer
  vf r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.0f);
  vi scale_bits = (ni + 127) << 23;  // 2^n
  vf scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}

// the largest lane, by a tree of lane shuffles (4 steps, no scalar loop)
inline float hmax(vf v) {
  v = v > __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}) ? v
      : __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  vf w = __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  v = v > w ? v : w;
  w = __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  v = v > w ? v : w;
  w = __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  v = v > w ? v : w;
  return v[0];
}

inline float hsum(vf v) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// float32 <-> the tensors' dtype (float32 or bfloat16), one element
inline float widen1(float x) { return x; }
inline float widen1(c10::BFloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline void narrow1(float x, float* out) { *out = x; }
inline void narrow1(float x, c10::BFloat16* out) {  // round to nearest even, as c10 does
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint16_t bits = std::isnan(x) ? uint16_t{0x7FC0}
                                      : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  out->x = bits;
}

// 16 elements of a row widened to float32 / narrowed from it (bfloat16: round to nearest even,
// NaN to 0x7FC0, as c10 does), whole vectors
typedef uint16_t vu16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t vu32 __attribute__((vector_size(kLanes * sizeof(uint32_t))));

inline vf load_wide(const float* p) { return load(p); }
inline vf load_wide(const c10::BFloat16* p) {
  vu16 h;
  std::memcpy(&h, p, sizeof h);
  const vu32 u = __builtin_convertvector(h, vu32) << 16;
  vf f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline void store_narrow(float* p, vf v) { store(p, v); }
inline void store_narrow(c10::BFloat16* p, vf v) {
  vu32 u;
  std::memcpy(&u, &v, sizeof u);
  vu32 r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  r = v != v ? vu32{} + 0x7FC0u : r;  // NaN
  const vu16 h = __builtin_convertvector(r, vu16);
  std::memcpy(p, &h, sizeof h);
}

// a row's int8 quantisation step, max_j |x_j| / 127, at least FLT_MIN; NaN where the row holds
// one (as abs().amax() gives). |x| as bits: for non-negative floats the integer order is the
// float order, and every NaN's bits lie above infinity's, so an integer max (which vectorises)
// propagates NaN.
inline float row_unit(const float* x, int64_t n) {
  uint32_t top = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    bits &= 0x7fffffffu;
    top = bits > top ? bits : top;
  }
  float m;
  std::memcpy(&m, &top, sizeof m);
  const float unit = m / 127.0f;
  constexpr float tiny = std::numeric_limits<float>::min();
  return unit < tiny ? tiny : unit;  // NaN stays NaN, as clamp_ keeps it
}

template <typename T>
void widen_row(const T* __restrict x, float* __restrict z, int64_t v) {
  for (int64_t j = 0; j < v; ++j) z[j] = widen1(x[j]);
}

}  // namespace transduce_vec
