// float32 products for the inference engine's projections (kernels/projection.py): y = x W^T + b,
// ReLU'd on request, W packed once into panels of 32 output channels (f32_pack: panel p holds
// W's rows 32p..32p+31 as (in, 32), input-major, zeros past W's last row).
//
// Why our own: a search step multiplies ~100 rows by each weight once, and the step's weights
// (19 MB at d_model 256) do not stay in L2 between steps. MKL's addmm on W^T repacks W's blocks
// on every call; here the panels go from memory straight into the registers. Each thread takes
// a share of the panels; a chunk of them (~256 KB, kept in L2) meets every block of up to 12
// rows of x in turn, the first block prefetching the panels ahead of its sums. A 12 x 32 block
// of y sums in 24 registers over the inputs in order (one fused multiply-add each), so a row's
// result does not depend on the other rows or their number.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include "api.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#define TRANSDUCE_F32_GEMM 1
#else
#define TRANSDUCE_F32_GEMM 0
#endif

namespace {

constexpr int64_t kPanel = 32;      // output channels a panel: two 16-lane registers
constexpr int64_t kBlockRows = 12;  // rows of x a block: 24 accumulators
constexpr int64_t kAhead = 64;      // inputs ahead that the first row block prefetches

int64_t panels_of(int64_t out) { return (out + kPanel - 1) / kPanel; }

// W (out, in) float32 -> (ceil(out / 32), in, 32): panel p, input k, channel c = W[32p + c, k]
at::Tensor f32_pack(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.dim() == 2 && w_in.scalar_type() == at::kFloat && w_in.device().is_cpu(),
              "W must be (out, in) float32 on the CPU");
  at::Tensor w = w_in.contiguous();
  const int64_t out = w.size(0), in = w.size(1), np = panels_of(out);
  at::Tensor packed = at::zeros({np, in, kPanel}, w.options());
  const float* wp = w.const_data_ptr<float>();
  float* pp = packed.mutable_data_ptr<float>();
  at::parallel_for(0, np, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t c = 0; c < kPanel && p * kPanel + c < out; ++c) {
        const float* row = wp + (p * kPanel + c) * in;
        float* dst = pp + p * in * kPanel + c;
        for (int64_t k = 0; k < in; ++k) dst[k * kPanel] = row[k];
      }
    }
  });
  return packed;
}

bool f32_gemm_available() { return TRANSDUCE_F32_GEMM != 0; }

#if TRANSDUCE_F32_GEMM
// y[r, j0 .. j0 + cols) for R rows of x (lda apart) against one panel b (in, 32): sums over k
// in order, then + bias and ReLU; cols < 32 only in the last panel
template <int R, bool kFetch>
void block(const float* x, int64_t lda, const float* b, int64_t in, const float* bias,
           bool relu, float* y, int64_t ldy, int64_t cols) {
  __m512 c0[R], c1[R];
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < in; ++k) {
    if (kFetch) {  // the first rows to meet the panels fetch ahead (past one's end: the next)
      _mm_prefetch(reinterpret_cast<const char*>(b + (k + kAhead) * kPanel), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + (k + kAhead) * kPanel + 16), _MM_HINT_T0);
    }
    const __m512 b0 = _mm512_loadu_ps(b + k * kPanel), b1 = _mm512_loadu_ps(b + k * kPanel + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32   ? 0xFFFF
                       : cols <= 16 ? 0
                                    : static_cast<__mmask16>((1u << (cols - 16)) - 1);
  __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    bias0 = _mm512_maskz_loadu_ps(m0, bias), bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    __m512 v0 = _mm512_add_ps(c0[r], bias0), v1 = _mm512_add_ps(c1[r], bias1);
    // max(0, v): with a NaN, max_ps returns its second operand, so v: a NaN stays (torch.relu's)
    if (relu) v0 = _mm512_max_ps(zero, v0), v1 = _mm512_max_ps(zero, v1);
    _mm512_mask_storeu_ps(y + r * ldy, m0, v0);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, v1);
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, const float*, bool, float*,
                         int64_t, int64_t);

template <bool kFetch, int... R>
constexpr auto block_table(std::integer_sequence<int, R...>) {
  return std::array<BlockFn, sizeof...(R)>{&block<R + 1, kFetch>...};
}
#endif

// x (N, in) float32, packed (f32_pack of W (out, in)), bias (out,) float32 or empty -> y (N,
// out) = x W^T + b, ReLU'd where ``relu``
at::Tensor f32_linear(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& bias,
                      int64_t out, bool relu) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "x must be (N, in) float32 on the CPU");
  const int64_t n = x_in.size(0), in = x_in.size(1);
  // (an ``out`` with W's panel count but not W's is not caught: the padding's zeros come out)
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kFloat && packed.is_contiguous() &&
                  packed.device().is_cpu() && packed.size(1) == in &&
                  packed.size(2) == kPanel && out >= 1 && packed.size(0) == panels_of(out),
              "packed must come from f32_pack of a W (out, in) with x's width");
  TORCH_CHECK(in >= 1, "x must have one input or more");
  const bool biased = bias.numel() > 0;
  TORCH_CHECK(!biased || (bias.numel() == out && bias.scalar_type() == at::kFloat &&
                          bias.is_contiguous() && bias.device().is_cpu()),
              "bias must be (out,) float32 or empty");
#if TRANSDUCE_F32_GEMM
  at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t lda = x.stride(0);
  at::Tensor y = at::empty({n, out}, x.options());
  if (n == 0) return y;
  static constexpr auto kBlocks =
      block_table<false>(std::make_integer_sequence<int, kBlockRows>{});
  static constexpr auto kFirst = block_table<true>(std::make_integer_sequence<int, kBlockRows>{});
  const float* xp = x.const_data_ptr<float>();
  const float* bp = packed.const_data_ptr<float>();
  const float* biasp = biased ? bias.const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  const int64_t np = packed.size(0);
  // panels a chunk: ~256 KB of W, read from L3 once and kept in L2 for every row block
  const int64_t chunk = std::max<int64_t>(1, (256 * 1024) / (in * kPanel * 4));
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  // the rows in blocks of near-equal size (100: eight of 11, one of 12): a short last block
  // would run its sums at a fraction of the registers' rate
  auto rows_of = [&](int64_t blk) { return n / blocks + (blk < n % blocks ? 1 : 0); };
  // threads on a grid: the panels in ``cols`` shares by the row blocks in ``groups`` (more
  // threads than panels, many cores on a narrow W, split the rows too)
  const int64_t want = at::get_num_threads();
  const int64_t cols = std::min(want, np);
  const int64_t groups = std::max<int64_t>(1, std::min(want / cols, blocks));
  const int64_t per = (np + cols - 1) / cols;
  // one cell of the grid: panels [lo, hi) by row blocks [b_lo, b_hi)
  auto cell = [&](int64_t share, int64_t group) {
    const int64_t lo = std::min(np, share * per), hi = std::min(np, lo + per);
    const int64_t b_lo = group * blocks / groups, b_hi = (group + 1) * blocks / groups;
    int64_t first_row = 0;
    for (int64_t blk = 0; blk < b_lo; ++blk) first_row += rows_of(blk);
    for (int64_t c0 = lo; c0 < hi; c0 += chunk) {
      const int64_t c1 = std::min(hi, c0 + chunk);
      for (int64_t blk = b_lo, i0 = first_row; blk < b_hi; i0 += rows_of(blk), ++blk) {
        const BlockFn fn = (blk == b_lo ? kFirst : kBlocks)[rows_of(blk) - 1];
        for (int64_t p = c0; p < c1; ++p) {
          const int64_t j0 = p * kPanel;
          fn(xp + i0 * lda, lda, bp + p * in * kPanel, in, biasp ? biasp + j0 : nullptr, relu,
             yp + i0 * out + j0, out, std::min(kPanel, out - j0));
        }
      }
    }
  };
#pragma omp parallel num_threads(cols * groups)
  {
    // (a smaller team than asked: the same grid, several cells a thread)
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t c = me; c < cols * groups; c += team) cell(c % cols, c / cols);
  }
  return y;
#else
  TORCH_CHECK(false, "built without AVX-512");
  return at::Tensor();
#endif
}

}  // namespace

namespace transduce_native_api {
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias,
                      int64_t out, bool relu) {
  return ::f32_linear(x, packed, bias, out, relu);
}
}  // namespace transduce_native_api

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("f32_gemm_available() -> bool", f32_gemm_available);
  m.def("f32_pack(Tensor w) -> Tensor", f32_pack);
  m.def("f32_linear(Tensor x, Tensor packed, Tensor bias, int out, bool relu) -> Tensor",
        f32_linear);
}
