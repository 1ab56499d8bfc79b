// Layer normalisation over the last dim for training on the CPU, forward and backward, for
// float32 or bfloat16 tensors (x, weight, bias, gradients all of one dtype), computed in float32:
//
//   forward:  mu = mean_j x_j, rstd = 1 / sqrt(mean_j (x_j - mu)^2 + eps) (two passes over the
//             row, which stays in the L1 cache), y_j = (x_j - mu) rstd w_j + b_j;
//   backward: xhat_j = (x_j - mu) rstd, gw_j = g_j w_j,
//             dx_j = rstd (gw_j - mean(gw) - xhat_j mean(gw xhat)),
//             dw = sum over rows of g xhat, db = sum over rows of g.
//
// PyTorch's bfloat16 kernels run several times slower than their memory traffic. dw and db are
// summed a fixed block of rows at a time, then over the blocks in order: the same numbers for
// any number of threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using namespace transduce_vec;

constexpr int64_t kRowsPerBlock = 32;

// z = x widened to float32; returns sum_j z_j
template <typename T>
float widen_and_sum(const T* __restrict x, float* __restrict z, int64_t n) {
  vf acc = vf{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const vf v = load_wide(x + j);
    store(z + j, v);
    acc += v;
  }
  float s = hsum(acc);
  for (; j < n; ++j) {
    z[j] = widen1(x[j]);
    s += z[j];
  }
  return s;
}

// sum_j (a_j - c)^2
inline float centred_squares(const float* a, int64_t n, float c) {
  const vf cv = splat(c);
  vf acc = vf{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const vf d = load(a + j) - cv;
    acc += d * d;
  }
  float s = hsum(acc);
  for (; j < n; ++j) s += (a[j] - c) * (a[j] - c);
  return s;
}

template <typename T>
void normed_row(const float* __restrict z, const float* __restrict w, const float* __restrict b,
                T* __restrict y, int64_t d, float mu, float rstd) {
  const vf mv = splat(mu), rv = splat(rstd);
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    store_narrow(y + j, (load(z + j) - mv) * rv * load(w + j) + load(b + j));
  }
  for (; j < d; ++j) narrow1((z[j] - mu) * rstd * w[j] + b[j], y + j);
}

// One row's backward pass in two sweeps: first xhat and gw (into scratch), dw += g xhat and
// db += g (this block's sums), sum gw and sum gw xhat; then dx.
template <typename T>
void backward_row(const T* __restrict x, const T* __restrict g, const float* __restrict w,
                  float* __restrict xhat, float* __restrict gw, float* __restrict dw,
                  float* __restrict db, T* __restrict dx, int64_t d, float mu, float rstd) {
  const vf mv = splat(mu), rv = splat(rstd);
  vf acc_a = vf{}, acc_c = vf{};
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    const vf xh = (load_wide(x + j) - mv) * rv, gv = load_wide(g + j);
    const vf gwv = gv * load(w + j);
    store(xhat + j, xh);
    store(gw + j, gwv);
    store(dw + j, load(dw + j) + gv * xh);
    store(db + j, load(db + j) + gv);
    acc_a += gwv;
    acc_c += gwv * xh;
  }
  float sa = hsum(acc_a), sc = hsum(acc_c);
  for (int64_t q = j; q < d; ++q) {
    const float xh = (widen1(x[q]) - mu) * rstd, gq = widen1(g[q]);
    xhat[q] = xh;
    gw[q] = gq * w[q];
    dw[q] += gq * xh;
    db[q] += gq;
    sa += gw[q];
    sc += gw[q] * xh;
  }
  const float a = sa / static_cast<float>(d), c = sc / static_cast<float>(d);
  const vf av = splat(a), cv = splat(c);
  j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    store_narrow(dx + j, rv * (load(gw + j) - av - load(xhat + j) * cv));
  }
  for (; j < d; ++j) narrow1(rstd * (gw[j] - a - xhat[j] * c), dx + j);
}

template <typename T>
std::vector<float> widened(const T* p, int64_t d) {
  std::vector<float> out(d);
  widen_row(p, out.data(), d);
  return out;
}

template <typename T>
void forward_rows(const T* x, const T* w_in, const T* b_in, T* y, float* mean, float* rstd,
                  int64_t rows, int64_t d, float eps) {
  const std::vector<float> w = widened(w_in, d), b = widened(b_in, d);
  at::parallel_for(0, rows, kRowsPerBlock, [&](int64_t begin, int64_t end) {
    std::vector<float> z(d);
    for (int64_t r = begin; r < end; ++r) {
      const float mu = widen_and_sum(x + r * d, z.data(), d) / static_cast<float>(d);
      const float var = centred_squares(z.data(), d, mu) / static_cast<float>(d);
      // a variance past float32's range (|x| ~ 1e18 and more) reads as NaN, not as rstd 0
      // (y = b, finite): a diverged residual stream must reach the loss and the guard
      const float rs = std::isfinite(var) ? 1.0f / std::sqrt(var + eps)
                                          : std::numeric_limits<float>::quiet_NaN();
      mean[r] = mu;
      rstd[r] = rs;
      normed_row(z.data(), w.data(), b.data(), y + r * d, d, mu, rs);
    }
  });
}

template <typename T>
void backward_rows(const T* g_in, const T* x, const float* mean, const float* rstd,
                   const T* w_in, T* dx, T* dw_out, T* db_out, int64_t rows, int64_t d) {
  const std::vector<float> w = widened(w_in, d);
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(static_cast<size_t>(2 * blocks * d), 0.0f);  // (blocks, 2, d)
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xhat(d), gw(d);
    for (int64_t blk = begin; blk < end; ++blk) {
      float* dw = partial.data() + 2 * blk * d;
      float* db = dw + d;
      const int64_t last = std::min(rows, (blk + 1) * kRowsPerBlock);
      for (int64_t r = blk * kRowsPerBlock; r < last; ++r) {
        backward_row(x + r * d, g_in + r * d, w.data(), xhat.data(), gw.data(), dw, db,
                     dx + r * d, d, mean[r], rstd[r]);
      }
    }
  });
  std::vector<float> dw(d, 0.0f), db(d, 0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk) {  // in order: independent of the threads
    const float* p = partial.data() + 2 * blk * d;
    for (int64_t j = 0; j < d; ++j) {
      dw[j] += p[j];
      db[j] += p[d + j];
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    narrow1(dw[j], dw_out + j);
    narrow1(db[j], db_out + j);
  }
}

void check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous (rows, d) CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16");
  const int64_t d = x.size(1);
  for (const at::Tensor* p : {&w, &b}) {
    TORCH_CHECK(p->scalar_type() == x.scalar_type() && p->dim() == 1 && p->size(0) == d &&
                    p->is_contiguous(), "weight and bias must be contiguous (d,) of x's dtype");
  }
  TORCH_CHECK(d >= 1, "rows need an element");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm(const at::Tensor& x,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& bias, double eps) {
  check(x, weight, bias);
  const int64_t rows = x.size(0), d = x.size(1);
  at::Tensor y = at::empty_like(x);
  auto f32 = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({rows}, f32), rstd = at::empty({rows}, f32);
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    forward_rows<float>(x.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                        bias.const_data_ptr<float>(), y.mutable_data_ptr<float>(),
                        mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), rows, d, e);
  } else {
    using B = c10::BFloat16;
    forward_rows<B>(x.const_data_ptr<B>(), weight.const_data_ptr<B>(), bias.const_data_ptr<B>(),
                    y.mutable_data_ptr<B>(), mean.mutable_data_ptr<float>(),
                    rstd.mutable_data_ptr<float>(), rows, d, e);
  }
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& weight) {
  check(x, weight, weight);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type() &&
                  grad.is_contiguous(), "grad must be contiguous, shaped and typed like x");
  const int64_t rows = x.size(0), d = x.size(1);
  TORCH_CHECK(mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat &&
                  mean.numel() == rows && rstd.numel() == rows && mean.is_contiguous() &&
                  rstd.is_contiguous(), "mean and rstd must be (rows,) float32");
  at::Tensor dx = at::empty_like(x), dw = at::empty_like(weight), db = at::empty_like(weight);
  if (x.scalar_type() == at::kFloat) {
    backward_rows<float>(grad.const_data_ptr<float>(), x.const_data_ptr<float>(),
                         mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                         weight.const_data_ptr<float>(), dx.mutable_data_ptr<float>(),
                         dw.mutable_data_ptr<float>(), db.mutable_data_ptr<float>(), rows, d);
  } else {
    using B = c10::BFloat16;
    backward_rows<B>(grad.const_data_ptr<B>(), x.const_data_ptr<B>(), mean.const_data_ptr<float>(),
                     rstd.const_data_ptr<float>(), weight.const_data_ptr<B>(),
                     dx.mutable_data_ptr<B>(), dw.mutable_data_ptr<B>(), db.mutable_data_ptr<B>(),
                     rows, d);
  }
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)",
        layer_norm);
  m.def("layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd, Tensor weight) -> "
        "(Tensor, Tensor, Tensor)",
        layer_norm_backward);
}
