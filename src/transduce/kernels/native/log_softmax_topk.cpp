// The k best log-probabilities of each row of logits, log_softmax(x) = x - m - log(sum exp(x - m))
// with m = max x, columns lo..hi never chosen (but counted in the sum): what beam search and
// greedy search take from each step's logits (kernels/topk_tiles.py), without writing the (N, V)
// log-probabilities that PyTorch's log_softmax and top-k pass over twice more. Rows marked in
// ``force`` have one candidate, column ``forced`` (EOS at a search's last step), then -inf.
//
// Per row, two passes over x (a row of a 37,000-word vocabulary stays in the L2 cache for the
// second): the max and the candidates a vector of 16 at a time (a vector is looked into only
// where a lane beats the k-th best so far: one compare, no reduction), then sum exp(x - m) with
// a vectorised exp (Cephes' polynomial, ~1 ulp). The values differ from PyTorch's log_softmax in
// the last bits (the sum's order and exp); ties keep the first index.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using namespace transduce_vec;

// the k best of a row so far, best first (a small sorted array: k is a beam's width)
struct Best {
  std::vector<float> value;
  std::vector<int64_t> index;
  explicit Best(int64_t k) : value(k, -kInf), index(k, -1) {}
  float threshold() const { return value.back(); }
  void offer(float v, int64_t i) {
    if (!(v > value.back())) return;  // ties keep the first index; NaN never enters
    int64_t pos = static_cast<int64_t>(value.size()) - 1;
    while (pos > 0 && v > value[pos - 1]) {
      value[pos] = value[pos - 1];
      index[pos] = index[pos - 1];
      --pos;
    }
    value[pos] = v;
    index[pos] = i;
  }
};

// whether any lane of y is above t's (NaN is not): one compare into a mask, no lane shuffles
inline bool any_above(vf y, vf t) {
#if defined(__AVX512F__)
  __m512 a, b;
  std::memcpy(&a, &y, sizeof a);
  std::memcpy(&b, &t, sizeof b);
  return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0;
#else
  const vi above = y > t;
  int32_t any = 0;
  for (int l = 0; l < kLanes; ++l) any |= above[l];
  return any != 0;
#endif
}

// forced >= 0: the row's only candidate is column ``forced`` (a search's last step, where EOS
// is forced), the others -inf; its value is still x - m - log(sum exp(x - m)) over the row
void row_topk(const float* x, int64_t v, int64_t k, int64_t lo, int64_t hi, int64_t forced,
              float* out_v, int64_t* out_i) {
  Best best(k);
  vf top = splat(-kInf);
  // a forced row offers nothing in the pass: no lane is ever above +inf
  vf threshold = splat(forced >= 0 ? kInf : best.threshold());
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes) {
    const vf y = load(x + j);
    top = y > top ? y : top;
    if (any_above(y, threshold)) {  // rare once k good ones are held
      for (int64_t q = j; q < j + kLanes; ++q) {
        if (q < lo || q > hi) best.offer(x[q], q);
      }
      threshold = splat(best.threshold());
    }
  }
  float m = hmax(top);
  for (; j < v; ++j) {
    m = x[j] > m ? x[j] : m;
    if (forced < 0 && (j < lo || j > hi)) best.offer(x[j], j);
  }
  if (forced >= 0) {  // the forced column first whatever its value (-inf, NaN), as in PyTorch's
    best.value[0] = x[forced];
    best.index[0] = forced;
  }
  // sum exp(x - m)
  vf acc = vf{};
  const vf mv = splat(m);
  int64_t q = 0;
  for (; q + kLanes <= v; q += kLanes) acc += exp_nonpositive(load(x + q) - mv);
  float s = hsum(acc);
  for (; q < v; ++q) s += std::exp(x[q] - m);
  // fewer than k choosable entries above -inf (a row masked to a few tokens): the rest are
  // -inf at the first choosable columns not taken, as a top-k of the log-probabilities gives
  for (int64_t c = 0, col = 0; c < k; ++c) {
    if (best.index[c] >= 0) continue;
    for (;; ++col) {
      bool taken = col >= lo && col <= hi;
      for (int64_t d = 0; d < c && !taken; ++d) taken = best.index[d] == col;
      if (!taken) break;
    }
    best.index[c] = col++;
  }
  const float log_s = std::log(s);
  for (int64_t c = 0; c < k; ++c) {
    // a forced row's others are -inf even where a NaN in the row made the sum NaN
    out_v[c] = (forced >= 0 && c > 0) ? -kInf : (best.value[c] - m) - log_s;
    out_i[c] = best.index[c];
  }
}

std::tuple<at::Tensor, at::Tensor> log_softmax_topk(const at::Tensor& logits, int64_t k,
                                                    int64_t lo, int64_t hi,
                                                    const at::Tensor& force, int64_t forced) {
  TORCH_CHECK(logits.dim() == 2, "logits must be (N, V)");
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "logits must be float32");
  TORCH_CHECK(logits.device().is_cpu(), "logits must be on the CPU");
  const int64_t n = logits.size(0), v = logits.size(1);
  const bool forcing = force.numel() > 0;
  TORCH_CHECK(!forcing || (force.dim() == 1 && force.size(0) == n &&
                           force.scalar_type() == at::kBool && force.device().is_cpu()),
              "force must be (N,) bool on the CPU, or empty");
  TORCH_CHECK(!forcing || (forced >= 0 && forced < v), "forced must be a column of the logits");
  const at::Tensor force_c = forcing ? force.contiguous() : force;
  const bool* fp = forcing ? force_c.const_data_ptr<bool>() : nullptr;
  const int64_t excluded = (hi >= lo) ? std::min(hi, v - 1) - std::max(lo, int64_t{0}) + 1 : 0;
  TORCH_CHECK(k >= 1 && k <= v - std::max(excluded, int64_t{0}),
              "k must be 1 .. the columns that may be chosen");
  at::Tensor x = logits.contiguous();
  at::Tensor values = at::empty({n, k}, x.options());
  at::Tensor indices = at::empty({n, k}, x.options().dtype(at::kLong));
  const float* xp = x.const_data_ptr<float>();
  float* vp = values.mutable_data_ptr<float>();
  int64_t* ip = indices.mutable_data_ptr<int64_t>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t f = (fp != nullptr && fp[r]) ? forced : -1;
      row_topk(xp + r * v, v, k, lo, hi, f, vp + r * k, ip + r * k);
    }
  });
  return {values, indices};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("log_softmax_topk(Tensor logits, int k, int lo, int hi, Tensor force, int forced) -> "
        "(Tensor, Tensor)",
        log_softmax_topk);
}
