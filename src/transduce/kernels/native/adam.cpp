// adam_bf16_copy(params, grads, exp_avgs, exp_avg_sqs, steps, working, lr, beta1, beta2, eps,
//   weight_decay, grad_scale, vector_width): one Adam step of float32 master weights from
//   gradients in bfloat16 (the working copy's, training/working_weights.py) or float32 (the
//   master weights' own, accumulated over batches), writing the updated weights rounded to
//   bfloat16 (nearest even) into the working copy. Per element i of each tensor, with
//   g = float(grad_i) * grad_scale (gradient clipping's coefficient, float32):
//     p <- p * (1 - lr * weight_decay)              (decoupled decay; skipped where it is 0)
//     m <- m + (1 - beta1) (g - m)                   (a lerp, as torch's: one fused multiply-add)
//     v <- ((1 - beta2) * g) * g + v * beta2       (the last product and the sum fused, as
//                                                   torch's build fuses them)
//     p <- p + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//     working <- bfloat16(p)
//   with t the tensor's step count, incremented here (a 0-dim float32 tensor, as torch's fused
//   Adam keeps it). That is torch.optim.Adam(fused=True)'s kernel operation for operation in
//   float32 (its constants rounded from float64 as it rounds them), so the master weights and
//   moments come out bit for bit as from widening the gradients into float32, torch's fused Adam
//   and the working copy cast anew: one pass of 28 bytes an element where those three take 40
//   (30 from float32 gradients, where the copy's 6 are saved; tests/kernels/test_adam.py). The
//   last numel % vector_width elements of each tensor are left alone (its step still counted):
//   torch's kernel runs them through a scalar loop that its compiler vectorised in part, with
//   other roundings; the caller steps them with torch's kernel (kernels/adam.py). Blocks of
//   16,384 elements of all tensors share the threads.
#pragma GCC optimize("fp-contract=off")  // a fused multiply-add only where torch's kernel has one

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kAdamBlock = 16384;

struct AdamConstants {
  float lerp_weight, lerp_coeff;  // 1 - beta1, and the multiplier of (g - m) torch's lerp uses
  bool small_weight;              // |1 - beta1| < 0.5: m + w (g - m); else g + (w - 1) (g - m)
  float beta2, sq_coeff;          // beta2, 1 - beta2
  float neg_step, bc2_sqrt, eps;  // -lr / (1 - beta1^t), sqrt(1 - beta2^t), eps
  bool decays;
  float decay;  // 1 - lr * weight_decay
  float grad_scale;
};

inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t narrow(float x) {  // round to nearest even, NaN to 0x7FC0, as c10 does
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return x != x ? uint16_t{0x7FC0} : static_cast<uint16_t>(r);
}

inline float widen(float x) { return x; }

template <bool kDecays, bool kSmallWeight, typename G>
void adam_elements(float* __restrict p, const G* __restrict grad, float* __restrict m,
                   float* __restrict v, uint16_t* __restrict w, int64_t n,
                   const AdamConstants& c) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = widen(grad[i]) * c.grad_scale;
    float pi = p[i];
    if (kDecays) pi = pi * c.decay;
    const float mi = m[i];
    const float mo = kSmallWeight ? std::fma(c.lerp_coeff, g - mi, mi)
                                  : std::fma(c.lerp_coeff, g - mi, g);
    const float vo = std::fma(c.sq_coeff * g, g, v[i] * c.beta2);
    m[i] = mo;
    v[i] = vo;
    const float denom = std::sqrt(vo) / c.bc2_sqrt + c.eps;
    pi = pi + c.neg_step * mo / denom;
    p[i] = pi;
    w[i] = narrow(pi);
  }
}

template <typename G>
void adam_block(float* p, const G* g, float* m, float* v, uint16_t* w, int64_t n,
                const AdamConstants& c) {
  if (c.decays) {
    c.small_weight ? adam_elements<true, true>(p, g, m, v, w, n, c)
                   : adam_elements<true, false>(p, g, m, v, w, n, c);
  } else {
    c.small_weight ? adam_elements<false, true>(p, g, m, v, w, n, c)
                   : adam_elements<false, false>(p, g, m, v, w, n, c);
  }
}

void check_like(const at::Tensor& t, const at::Tensor& param, at::ScalarType dtype,
                const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() &&
                  t.numel() == param.numel(),
              "adam_bf16_copy: each of ", what, " must be a contiguous CPU ",
              dtype == at::kFloat ? "float32" : "bfloat16", " tensor as long as its parameter");
}

void adam_bf16_copy(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList steps, at::TensorList working,
                    double lr, double beta1, double beta2, double eps, double weight_decay,
                    double grad_scale, int64_t vector_width) {
  const size_t k = params.size();
  TORCH_CHECK(vector_width >= 1, "adam_bf16_copy: vector_width must be positive");
  TORCH_CHECK(grads.size() == k && exp_avgs.size() == k && exp_avg_sqs.size() == k &&
                  steps.size() == k && working.size() == k,
              "adam_bf16_copy: the six lists must be equally long");
  for (size_t j = 0; j < k; ++j) {  // every tensor checked before anything is written
    const at::Tensor& param = params[j];
    check_like(param, param, at::kFloat, "params");
    check_like(grads[j], param,
               grads[j].scalar_type() == at::kFloat ? at::kFloat : at::kBFloat16, "grads");
    check_like(exp_avgs[j], param, at::kFloat, "exp_avgs");
    check_like(exp_avg_sqs[j], param, at::kFloat, "exp_avg_sqs");
    check_like(working[j], param, at::kBFloat16, "working");
    const at::Tensor& step = steps[j];
    TORCH_CHECK(step.device().is_cpu() && step.scalar_type() == at::kFloat && step.numel() == 1,
                "adam_bf16_copy: each step must be a one-element float32 CPU tensor");
  }
  std::vector<AdamConstants> constants(k);
  std::vector<int64_t> first_block(k + 1, 0);  // tensor j's blocks: first_block[j] ..[j + 1]
  std::vector<int64_t> body(k, 0);             // tensor j's elements stepped here
  for (size_t j = 0; j < k; ++j) {
    const at::Tensor& param = params[j];
    float* t = steps[j].mutable_data_ptr<float>();
    *t = *t + 1.0f;  // torch's _foreach_add_(steps, 1)
    const double count = *t;
    // the constants as torch's kernel makes them: float64, then rounded to float32
    const double bc1 = 1 - std::pow(beta1, count), bc2 = 1 - std::pow(beta2, count);
    const double step_size = lr / bc1;
    AdamConstants& c = constants[j];
    c.lerp_weight = static_cast<float>(1 - beta1);
    c.small_weight = std::abs(c.lerp_weight) < 0.5f;
    c.lerp_coeff = c.small_weight ? c.lerp_weight : c.lerp_weight - 1.0f;
    c.beta2 = static_cast<float>(beta2);
    c.sq_coeff = static_cast<float>(1 - beta2);
    c.neg_step = static_cast<float>(-step_size);
    c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    c.eps = static_cast<float>(eps);
    c.decays = weight_decay != 0.0;
    c.decay = static_cast<float>(1 - lr * weight_decay);
    c.grad_scale = static_cast<float>(grad_scale);
    body[j] = param.numel() - param.numel() % vector_width;
    first_block[j + 1] = first_block[j] + (body[j] + kAdamBlock - 1) / kAdamBlock;
  }
  at::parallel_for(0, first_block[k], 1, [&](int64_t begin, int64_t end) {
    size_t j = 0;
    for (int64_t b = begin; b < end; ++b) {
      while (first_block[j + 1] <= b) ++j;  // blocks are in tensor order
      const int64_t at = (b - first_block[j]) * kAdamBlock;
      const int64_t n = std::min(kAdamBlock, body[j] - at);
      float* const p = params[j].mutable_data_ptr<float>() + at;
      float* const m = exp_avgs[j].mutable_data_ptr<float>() + at;
      float* const v = exp_avg_sqs[j].mutable_data_ptr<float>() + at;
      uint16_t* const w =
          reinterpret_cast<uint16_t*>(working[j].mutable_data_ptr<c10::BFloat16>()) + at;
      if (grads[j].scalar_type() == at::kFloat) {
        adam_block(p, grads[j].const_data_ptr<float>() + at, m, v, w, n, constants[j]);
      } else {
        const auto* g = reinterpret_cast<const uint16_t*>(grads[j].const_data_ptr<c10::BFloat16>());
        adam_block(p, g + at, m, v, w, n, constants[j]);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("adam_bf16_copy(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
        "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] steps, Tensor(e!)[] working, float lr, "
        "float beta1, float beta2, float eps, float weight_decay, float grad_scale, "
        "int vector_width) -> ()",
        adam_bf16_copy);
}
