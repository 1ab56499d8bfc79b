// Per-row int8 quantisation of activations for the int8 projections (kernels/quantized.py), in
// one pass over x where PyTorch takes about ten operators. The numbers are bit for bit those of
// quantized.py's PyTorch form (tested): the same float32 operations in the same order.
//
// x (N, in) float32, contiguous. A row's unit is u = max(max_j |x_ij| / 127, FLT_MIN); then
//   int8_rows:  k_ij = nearbyint(x_ij / u + 128) - 128 as int8 (ties to even), and u (N, 1);
//   guarded_rows: (1 + N, in) float32, first the guard row (-128, 127, 127, ...), then x_ij / u.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

namespace {

using transduce_vec::row_unit;

constexpr int64_t kGrain = 8;  // rows a task: a row of 256+ floats is ~0.1 us of work

// k_j = nearbyint(x_j / u + 128) - 128 as int8, and x_j / u: a function of its own with
// unaliased pointers, so that the loop vectorises inside OpenMP's outlined region too
void int8_row(const float* __restrict x, int8_t* __restrict out, int64_t n, float unit) {
  for (int64_t j = 0; j < n; ++j) {
    const float k = std::nearbyint(x[j] / unit + 128.0f) - 128.0f;
    out[j] = static_cast<int8_t>(static_cast<int32_t>(k));
  }
}

void scaled_row(const float* __restrict x, float* __restrict out, int64_t n, float unit) {
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] / unit;
}

void check(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "x must be (N, in), got ", x.dim(), " dims");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be float32");
  TORCH_CHECK(x.device().is_cpu(), "x must be on the CPU");
}

std::tuple<at::Tensor, at::Tensor> int8_rows(const at::Tensor& x_in) {
  check(x_in);
  at::Tensor x = x_in.contiguous();
  const int64_t n = x.size(0), width = x.size(1);
  at::Tensor q = at::empty({n, width}, x.options().dtype(at::kChar));
  at::Tensor units = at::empty({n, 1}, x.options());
  const float* xp = x.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  float* up = units.mutable_data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * width;
      const float unit = row_unit(row, width);
      up[i] = unit;
      int8_row(row, qp + i * width, width, unit);
    }
  });
  return {q, units};
}

std::tuple<at::Tensor, at::Tensor> guarded_rows(const at::Tensor& x_in) {
  check(x_in);
  at::Tensor x = x_in.contiguous();
  const int64_t n = x.size(0), width = x.size(1);
  TORCH_CHECK(width >= 2, "the guard row needs 2 or more inputs");
  at::Tensor rows = at::empty({n + 1, width}, x.options());
  at::Tensor units = at::empty({n, 1}, x.options());
  const float* xp = x.const_data_ptr<float>();
  float* rp = rows.mutable_data_ptr<float>();
  float* up = units.mutable_data_ptr<float>();
  rp[0] = -128.0f;
  for (int64_t j = 1; j < width; ++j) rp[j] = 127.0f;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * width;
      const float unit = row_unit(row, width);
      up[i] = unit;
      scaled_row(row, rp + (i + 1) * width, width, unit);
    }
  });
  return {rows, units};
}

}  // namespace

TORCH_LIBRARY(transduce_native, m) {
  m.def("int8_rows(Tensor x) -> (Tensor, Tensor)", int8_rows);
  m.def("guarded_rows(Tensor x) -> (Tensor, Tensor)", guarded_rows);
}
