// Training kernels for the CPU, each one pass where PyTorch takes several operators:
//
// dropout_keep_scale(like, scale, threshold, seed): a tensor shaped and typed like `like` holding
//   `scale` (a 0-dim tensor in like's dtype: 1 / (1 - p) rounded) where an element is kept and 0
//   where dropped. Element i is kept where the 16-bit draw u_i >= threshold (= floor(p * 2^16)),
//   so P(drop) = threshold / 2^16. The draws are the four 16-bit quarters of SplitMix64's output
//   words w_k = mix64(seed + (k + 1) * golden) (Steele et al. 2014; passes BigCrush), u_{4k + l}
//   = bits 16l..16l+15 of w_k: a counter-based stream, the same for any number of threads.
//
// smoothed_cross_entropy(logits, target, keep, eps, grad_scale, grad) -> (lse, z_y, z_sum):
//   per row of logits z (N, V) (float32 or bfloat16), log sum_v exp z_v, z at the target and
//   sum_v z_v in float32; where `grad` is given (N, V, logits' dtype; it may be the logits
//   themselves), the gradient of the label-smoothed loss (softmax(z) - q) * grad_scale with
//   q = (1 - eps) onehot(y) + eps / V, written in its dtype (rounded to nearest even), and 0 on
//   the rows where keep is false. A row is widened to float32 into a scratch row that stays in
//   the L2 cache (148 kB for 37,000 words): the logits are read once and the gradient written
//   once, where PyTorch's chunked form (training/loss.py) copies each chunk to float32 and back.
//   exp is Cephes' polynomial (vec.h; exp(z - max) below -87 reads as exp(-87), ~1.6e-38).
//
// sum_of_squares(xs): sum over float32 or bfloat16 tensors of sum_i x_i^2 in float64 (the
//   gradient norm's square; bfloat16 is widened exactly, so it is the float32 copy's sum), a
//   block of 16,384 elements a task with 8 float64 lanes, the blocks summed in order: the same
//   number for any number of threads, no overflow below ~1e154.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using namespace transduce_vec;

// ---------------------------------------------------------------------------- dropout

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr int64_t kWordsPerBlock = 512;  // 2,048 draws a task

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void draw_words(uint64_t* __restrict out, int64_t first, int64_t count, uint64_t seed) {
  for (int64_t k = 0; k < count; ++k) {
    out[k] = mix64(seed + static_cast<uint64_t>(first + k + 1) * kGolden);
  }
}

template <typename Bits>
void select_bits(const uint16_t* __restrict draws, Bits* __restrict out, int64_t count,
                 uint32_t threshold, Bits kept) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<uint32_t>(draws[i]) >= threshold ? kept : Bits{0};
  }
}

template <typename Bits>
void keep_scale_fill(Bits* out, int64_t n, uint32_t threshold, uint64_t seed, Bits kept) {
  const int64_t words = (n + 3) / 4;
  at::parallel_for(0, (words + kWordsPerBlock - 1) / kWordsPerBlock, 1,
                   [&](int64_t begin, int64_t end) {
    uint64_t block[kWordsPerBlock];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kWordsPerBlock;
      const int64_t count = std::min(kWordsPerBlock, words - first);
      draw_words(block, first, count, seed);
      const int64_t elements = std::min(4 * count, n - 4 * first);
      uint16_t draws[4 * kWordsPerBlock];  // the words' quarters in order (little-endian)
      std::memcpy(draws, block, sizeof(uint64_t) * count);
      select_bits<Bits>(draws, out + 4 * first, elements, threshold, kept);
    }
  });
}

at::Tensor dropout_keep_scale(const at::Tensor& like, const at::Tensor& scale, int64_t threshold,
                              int64_t seed) {
  TORCH_CHECK(like.device().is_cpu(), "dropout_keep_scale: CPU tensors only");
  TORCH_CHECK(scale.dim() == 0 && scale.scalar_type() == like.scalar_type(),
              "scale must be a 0-dim tensor of like's dtype");
  TORCH_CHECK(threshold >= 0 && threshold <= 65536, "threshold must be 0 .. 65536");
  at::Tensor out = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = out.numel();
  const uint32_t thr = static_cast<uint32_t>(threshold);
  const uint64_t s = static_cast<uint64_t>(seed);
  const int64_t size = out.element_size();
  if (size == 2) {
    uint16_t kept;
    std::memcpy(&kept, scale.const_data_ptr(), 2);
    keep_scale_fill<uint16_t>(static_cast<uint16_t*>(out.mutable_data_ptr()), n, thr, s, kept);
  } else if (size == 4) {
    uint32_t kept;
    std::memcpy(&kept, scale.const_data_ptr(), 4);
    keep_scale_fill<uint32_t>(static_cast<uint32_t*>(out.mutable_data_ptr()), n, thr, s, kept);
  } else {
    TORCH_CHECK(false, "dropout_keep_scale: 2- or 4-byte floating dtypes only");
  }
  return out;
}

// ---------------------------------------------------------------------- cross-entropy

// g_j = e_j * a - b, in g's dtype
template <typename T>
void narrow_row(const float* __restrict e, T* __restrict g, int64_t v, float a, float b) {
  const vf av = splat(a), bv = splat(b);
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) store_narrow(g + j, load(e + j) * av - bv);
  for (; j < v; ++j) narrow1(e[j] * a - b, g + j);
}

// (max, sum) of z (v floats)
inline void max_and_sum(const float* z, int64_t v, float* m_out, float* s_out) {
  vf top = splat(-kInf), acc = vf{};
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) {
    const vf y = load(z + j);
    top = y > top ? y : top;
    acc += y;
  }
  float m = hmax(top), s = hsum(acc);
  for (; j < v; ++j) {
    m = z[j] > m ? z[j] : m;
    s += z[j];
  }
  *m_out = m;
  *s_out = s;
}

// z_j <- exp(z_j - m); returns their sum
inline float exp_in_place(float* z, int64_t v, float m) {
  const vf mv = splat(m);
  vf acc = vf{};
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) {
    const vf e = exp_nonpositive(load(z + j) - mv);
    store(z + j, e);
    acc += e;
  }
  float s = hsum(acc);
  for (; j < v; ++j) {
    z[j] = std::exp(z[j] - m);
    s += z[j];
  }
  return s;
}

template <typename T>
void ce_row(const T* x, T* g, float* z, int64_t v, int64_t t, bool keep, float eps, float scale,
            float* lse, float* z_y, float* z_sum) {
  widen_row(x, z, v);
  float m, total;
  max_and_sum(z, v, &m, &total);
  *z_y = z[t];
  *z_sum = total;
  const float s = exp_in_place(z, v, m);
  *lse = m + std::log(s);
  if (g == nullptr) return;
  if (!keep) {
    std::memset(static_cast<void*>(g), 0, sizeof(T) * v);
    return;
  }
  const float a = scale / s, b = scale * (eps / static_cast<float>(v));
  narrow_row(z, g, v, a, b);
  narrow1(z[t] * a - b - scale * (1.0f - eps), g + t);
}

template <typename T>
void ce_rows(const T* x, T* g, const int64_t* target, const bool* keep, int64_t n, int64_t v,
             float eps, float scale, float* lse, float* z_y, float* z_sum) {
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> z(v);  // this task's float32 row
    for (int64_t r = begin; r < end; ++r) {
      ce_row<T>(x + r * v, g == nullptr ? nullptr : g + r * v, z.data(), v, target[r], keep[r],
                eps, scale, lse + r, z_y + r, z_sum + r);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> smoothed_cross_entropy(
    const at::Tensor& logits, const at::Tensor& target, const at::Tensor& keep, double eps,
    double grad_scale, const std::optional<at::Tensor>& grad) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.device().is_cpu(),
              "logits must be a contiguous (N, V) CPU tensor");
  const auto dtype = logits.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "logits must be float32 or bfloat16");
  const int64_t n = logits.size(0), v = logits.size(1);
  TORCH_CHECK(v >= 1, "logits need a column");
  TORCH_CHECK(target.scalar_type() == at::kLong && target.dim() == 1 && target.size(0) == n &&
                  target.is_contiguous(), "target must be contiguous (N,) int64");
  TORCH_CHECK(keep.scalar_type() == at::kBool && keep.dim() == 1 && keep.size(0) == n &&
                  keep.is_contiguous(), "keep must be contiguous (N,) bool");
  const int64_t* tp = target.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(tp[r] >= 0 && tp[r] < v, "target ", tp[r], " at row ", r, " is not a column");
  }
  if (grad.has_value()) {
    TORCH_CHECK(grad->sizes() == logits.sizes() && grad->scalar_type() == dtype &&
                    grad->is_contiguous() && grad->device().is_cpu(),
                "grad must be a contiguous CPU tensor shaped and typed like logits");
  }
  auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor lse = at::empty({n}, f32), z_y = at::empty({n}, f32), z_sum = at::empty({n}, f32);
  const bool* kp = keep.const_data_ptr<bool>();
  const float e = static_cast<float>(eps), sc = static_cast<float>(grad_scale);
  float *lp = lse.mutable_data_ptr<float>(), *yp = z_y.mutable_data_ptr<float>(),
        *sp = z_sum.mutable_data_ptr<float>();
  if (dtype == at::kFloat) {
    float* gp = grad.has_value() ? grad->mutable_data_ptr<float>() : nullptr;
    ce_rows<float>(logits.const_data_ptr<float>(), gp, tp, kp, n, v, e, sc, lp, yp, sp);
  } else {
    c10::BFloat16* gp = grad.has_value() ? grad->mutable_data_ptr<c10::BFloat16>() : nullptr;
    ce_rows<c10::BFloat16>(logits.const_data_ptr<c10::BFloat16>(), gp, tp, kp, n, v, e, sc, lp,
                           yp, sp);
  }
  return {lse, z_y, z_sum};
}

// ------------------------------------------------------------------- sum of squares

constexpr int64_t kSquaresBlock = 16384;
typedef double vd __attribute__((vector_size(8 * sizeof(double))));
typedef float vf8 __attribute__((vector_size(8 * sizeof(float))));

// x widened to float32 (bfloat16: exactly) 16 elements at a time, squared in float64
template <typename T>
double block_squares(const T* x, int64_t n) {
  vd acc0 = vd{}, acc1 = vd{};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const vf w = load_wide(x + j);
    vf8 a, b;
    std::memcpy(&a, &w, sizeof a);
    std::memcpy(&b, reinterpret_cast<const char*>(&w) + sizeof a, sizeof b);
    const vd da = __builtin_convertvector(a, vd), db = __builtin_convertvector(b, vd);
    acc0 += da * da;
    acc1 += db * db;
  }
  acc0 += acc1;
  double s = 0.0;
  for (int l = 0; l < 8; ++l) s += acc0[l];
  for (; j < n; ++j) {
    const double d = widen1(x[j]);
    s += d * d;
  }
  return s;
}

template <typename T>
double tensor_squares(const T* p, int64_t n) {
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kSquaresBlock;
      partial[b] = block_squares(p + first, std::min(kSquaresBlock, n - first));
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;  // in order: independent of the threads
  return total;
}

at::Tensor sum_of_squares(at::TensorList xs) {
  double total = 0.0;
  for (const at::Tensor& t : xs) {
    const auto dtype = t.scalar_type();
    TORCH_CHECK(t.device().is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
                    t.is_contiguous(),
                "sum_of_squares takes contiguous float32 or bfloat16 CPU tensors");
    total += dtype == at::kFloat
                 ? tensor_squares(t.const_data_ptr<float>(), t.numel())
                 : tensor_squares(t.const_data_ptr<c10::BFloat16>(), t.numel());
  }
  return at::scalar_tensor(total, at::TensorOptions().dtype(at::kDouble));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("dropout_keep_scale(Tensor like, Tensor scale, int threshold, int seed) -> Tensor",
        dropout_keep_scale);
  m.def("smoothed_cross_entropy(Tensor logits, Tensor target, Tensor keep, float eps, "
        "float grad_scale, Tensor(a!)? grad) -> (Tensor, Tensor, Tensor)",
        smoothed_cross_entropy);
  m.def("sum_of_squares(Tensor[] xs) -> Tensor", sum_of_squares);
}
