// One step of beam search's choice on the CPU (inference/beam_choice.py, ``choose``), in one
// pass over the n sentences where PyTorch takes ~30 operators on (n, W) tensors, each costing
// more to call than its work: from each hypothesis's P best next tokens, the W best one-token
// extensions of each sentence; those that enter the beam and end (EOS); the sentences' finished
// counts and W best finished scores; which sentences are done (the bound of beam.py's
// docstring); and for those that go on, the cache rows, tokens and live scores of the next step,
// hypotheses in their parents' slots where asked (``parent_slots``).
//
// The numbers are the PyTorch form's bit for bit: the same float32 sums, divisions and
// comparisons. Of equal candidates the first (in hypothesis-major order) is taken, as the
// native log_softmax_topk does, where torch.topk may take any: a tie of finite scores at the
// beam's edge can choose another of them. NaN ranks above every number, as in torch.topk.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// a candidate's rank: NaN first, then larger values, then the earlier index
inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// parent_slots of beam_choice.py for one sentence: slot s takes hypothesis perm[s], the first
// live one extending s where there is one, the unclaimed hypotheses in order for the other slots
void parent_slots(const int64_t* parent, const bool* live, int64_t w, int64_t* perm) {
  std::vector<char> claimed(w, 0);
  std::vector<int64_t> first(w, -1);
  for (int64_t s = 0; s < w; ++s) {
    for (int64_t j = 0; j < w; ++j) {
      if (live[j] && parent[j] == s) {
        first[s] = j;
        claimed[j] = 1;
        break;
      }
    }
  }
  int64_t next = 0;  // the next unclaimed hypothesis
  for (int64_t s = 0; s < w; ++s) {
    if (first[s] >= 0) {
      perm[s] = first[s];
      continue;
    }
    while (claimed[next]) ++next;
    perm[s] = next++;
  }
}

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                           at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, bool>;

Outputs beam_select(const at::Tensor& row_top_in, const at::Tensor& row_tok_in,
                    const at::Tensor& scores_in, const at::Tensor& n_finished_in,
                    const at::Tensor& finished_in, const at::Tensor& lp_max_len_in,
                    const at::Tensor& max_lens_in, int64_t step, double lp_now, double lp_next,
                    int64_t nbest, int64_t eos, bool in_place) {
  TORCH_CHECK(scores_in.dim() == 2 && scores_in.scalar_type() == at::kFloat,
              "scores must be (n, W) float32");
  const int64_t n = scores_in.size(0), w = scores_in.size(1);
  TORCH_CHECK(row_top_in.dim() == 2 && row_top_in.size(0) == n * w &&
                  row_top_in.scalar_type() == at::kFloat,
              "row_top must be (n*W, P) float32");
  const int64_t p = row_top_in.size(1);
  TORCH_CHECK(p >= 1 && w >= 1, "need W >= 1 and P >= 1");
  TORCH_CHECK(row_tok_in.sizes() == row_top_in.sizes() && row_tok_in.scalar_type() == at::kLong,
              "row_tok must be (n*W, P) int64");
  TORCH_CHECK(finished_in.sizes() == scores_in.sizes() && finished_in.scalar_type() == at::kFloat,
              "finished_scores must be (n, W) float32");
  for (const at::Tensor* t : {&n_finished_in, &max_lens_in}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == n && t->scalar_type() == at::kLong,
                "n_finished and max_lens must be (n,) int64");
  }
  TORCH_CHECK(lp_max_len_in.dim() == 1 && lp_max_len_in.size(0) == n &&
                  lp_max_len_in.scalar_type() == at::kFloat,
              "lp_max_len must be (n,) float32");
  TORCH_CHECK(nbest >= 1 && nbest <= w, "nbest must be 1 .. W");
  for (const at::Tensor* t : {&row_top_in, &row_tok_in, &scores_in, &n_finished_in, &finished_in,
                              &lp_max_len_in, &max_lens_in}) {
    TORCH_CHECK(t->device().is_cpu(), "every tensor must be on the CPU");
  }
  const at::Tensor row_top = row_top_in.contiguous(), row_tok = row_tok_in.contiguous();
  const at::Tensor scores = scores_in.contiguous(), n_fin_old = n_finished_in.contiguous();
  const at::Tensor fin_old = finished_in.contiguous(), lp_max = lp_max_len_in.contiguous();
  const at::Tensor max_lens = max_lens_in.contiguous();
  const auto f32 = scores.options(), i64 = f32.dtype(at::kLong);
  at::Tensor top = at::empty({n, w}, f32), parent = at::empty({n, w}, i64);
  at::Tensor tok = at::empty({n, w}, i64), ended = at::empty({n, w}, f32.dtype(at::kBool));
  at::Tensor normalised = at::empty({n, w}, f32), live = at::empty({n, w}, f32);
  at::Tensor fin_new = at::empty({n, w}, f32), n_fin_new = at::empty({n}, i64);
  const float* rt = row_top.const_data_ptr<float>();
  const int64_t* rk = row_tok.const_data_ptr<int64_t>();
  const float* sc = scores.const_data_ptr<float>();
  const int64_t* nf = n_fin_old.const_data_ptr<int64_t>();
  const float* fo = fin_old.const_data_ptr<float>();
  const float* lpm = lp_max.const_data_ptr<float>();
  const int64_t* ml = max_lens.const_data_ptr<int64_t>();
  float* tp = top.mutable_data_ptr<float>();
  int64_t* pp = parent.mutable_data_ptr<int64_t>();
  int64_t* kp = tok.mutable_data_ptr<int64_t>();
  bool* ep = ended.mutable_data_ptr<bool>();
  float* np = normalised.mutable_data_ptr<float>();
  float* lv = live.mutable_data_ptr<float>();
  float* fn = fin_new.mutable_data_ptr<float>();
  int64_t* nn = n_fin_new.mutable_data_ptr<int64_t>();
  const float lp_now_f = static_cast<float>(lp_now), lp_next_f = static_cast<float>(lp_next);
  const int64_t wp = w * p;
  std::vector<float> cand(wp);
  std::vector<int64_t> order(wp);
  std::vector<float> merged(2 * w);
  std::vector<int64_t> going;
  going.reserve(n);
  bool any_ended = false;
  for (int64_t i = 0; i < n; ++i) {
    // the W best of the hypotheses' scores plus their P best next log-probabilities
    for (int64_t c = 0; c < wp; ++c) {
      cand[c] = sc[i * w + c / p] + rt[i * wp + c];
      order[c] = c;
    }
    std::partial_sort(order.begin(), order.begin() + w, order.end(), [&](int64_t a, int64_t b) {
      return ranks_before(cand[a], a, cand[b], b);
    });
    const int64_t room = w - nf[i];  // the candidates that may still enter
    int64_t ends = 0;
    float best_live = kNegInf;
    for (int64_t j = 0; j < w; ++j) {
      const int64_t c = order[j], o = i * w + j;
      const float v = cand[c];
      tp[o] = v;
      pp[o] = c / p;
      kp[o] = rk[i * wp + c];
      const bool entered = j < room && v > kNegInf;
      const bool is_eos = kp[o] == eos;
      ep[o] = entered && is_eos;
      ends += ep[o];
      np[o] = v / lp_now_f;
      lv[o] = (entered && !is_eos) ? v : kNegInf;
      best_live = std::max(best_live, lv[o]);  // (NaN never live: it does not enter)
    }
    nn[i] = nf[i] + ends;
    any_ended = any_ended || ends > 0;
    // the W best finished scores, the old ones and the step's normalised ended ones
    for (int64_t j = 0; j < w; ++j) {
      merged[j] = fo[i * w + j];
      merged[w + j] = ep[i * w + j] ? np[i * w + j] : kNegInf;
    }
    std::partial_sort(merged.begin(), merged.begin() + w, merged.end(), std::greater<float>());
    std::copy(merged.begin(), merged.begin() + w, fn + i * w);
    const float lp_bound = lpm[i] < lp_next_f ? lp_next_f : lpm[i];
    const bool done = best_live / lp_bound <= fn[i * w + nbest - 1] || ml[i] <= step;
    if (!done) going.push_back(i);
  }
  // the next step's cache rows, tokens and live scores for the sentences that go on
  const int64_t kept = static_cast<int64_t>(going.size());
  const bool all = kept == n;
  at::Tensor keep = at::empty({kept}, i64);
  at::Tensor rows = at::empty({kept * w}, i64), next_tok = at::empty({kept * w, 1}, i64);
  at::Tensor next_scores = at::empty({kept, w}, f32);
  int64_t* kpp = keep.mutable_data_ptr<int64_t>();
  int64_t* rp = rows.mutable_data_ptr<int64_t>();
  int64_t* ntp = next_tok.mutable_data_ptr<int64_t>();
  float* nsp = next_scores.mutable_data_ptr<float>();
  std::vector<int64_t> perm(w);
  std::vector<char> is_live(w);
  for (int64_t r = 0; r < kept; ++r) {
    const int64_t i = going[r];
    kpp[r] = i;
    for (int64_t j = 0; j < w; ++j) {
      is_live[j] = lv[i * w + j] > kNegInf;
      perm[j] = j;
    }
    if (in_place && all) {
      parent_slots(pp + i * w, reinterpret_cast<const bool*>(is_live.data()), w, perm.data());
    }
    for (int64_t s = 0; s < w; ++s) {
      const int64_t j = perm[s], o = i * w + j;
      // an ended hypothesis's row is never read again: it stays where it is
      rp[r * w + s] = i * w + (is_live[j] ? pp[o] : s);
      ntp[r * w + s] = kp[o];
      nsp[r * w + s] = lv[o];
    }
  }
  return {top, parent, tok, ended, normalised, fin_new, n_fin_new, keep, rows, next_tok,
          next_scores, any_ended};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("beam_select(Tensor row_top, Tensor row_tok, Tensor scores, Tensor n_finished, "
        "Tensor finished_scores, Tensor lp_max_len, Tensor max_lens, int step, float lp_now, "
        "float lp_next, int nbest, int eos, bool in_place) -> (Tensor, Tensor, Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool)",
        beam_select);
}
