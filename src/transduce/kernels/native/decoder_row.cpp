// One decoding step of the few hypothesis rows of one sentence (a sentence decoded alone: greedy,
// one row; beam search, a row a hypothesis) through the whole decoder and the pre-softmax
// projection, in one call: what the inference engine's DecodingModel computes there with ~20
// PyTorch operators a layer, each a few microseconds of dispatch around a product that reads its
// weights in tens (benchmarks/step_cost.py). Here one OpenMP team runs the step; each product
// splits the rows of W over the threads and reads each once for all the hypothesis rows, the
// small work between products (layer norms, attention over the cache, softmax) runs on the
// threads by (row, head) or on one, with a barrier after each.
//
// The weights come packed in one float32 tensor (inference/engine/native_row.py packs them, in
// the order of Layer below); the self-attention cache is the engine's own buffers, (N,
// capacity, H, K) per layer, position t written here; encoder-decoder attention either folded (A, c, M of
// inference/engine/folded_attention.py) or on the projected keys and values with an additive
// mask. Sums run in another order than PyTorch's products: results agree within float32
// rounding, not bit for bit.
//
// With int8 weights (per output channel, kernels/quantized.py's quantize_weight) every product
// quantises its input row as the engine's int8 projections do (k = nearbyint(x / u + 128) - 128,
// u = max |x| / 127) and sums k . w in int32 exactly (AVX512-VNNI where the CPU has it, with
// 128 * sum_i w_i taken off for the unsigned input); the result, (sum * scale) * u + b, is the
// one fbgemm's kernel gives, within a float32 rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include "api.h"
#include "vec.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace transduce_vec;

enum Activation : int64_t { kRelu = 0, kSwish = 1, kGelu = 2 };

struct Dims {
  int64_t layers, d, heads, dk, dv, ff, vocab, activation, pre_norm;
  int64_t qkv() const { return heads * (2 * dk + dv); }
};

// a projection's weights: float32 W (out, in) (nn.Linear's layout, row-major), or int8 W with
// its rows' scales and sums; and b (out,)
struct Matrix {
  const float* w = nullptr;
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int32_t* row_sum = nullptr;
  const float* b = nullptr;
  int64_t out = 0, in = 0;
};

// walks the packed tensors in native_row.py's order: a matrix is W then b (int8: its scales in
// the floats, its int8 rows and their sums in their own tensors); offsets, so that the sizes
// can be counted before any pointer is taken
struct Packed {
  const float* f;
  const int8_t* q;
  const int32_t* r;
  bool int8;
  int64_t nf = 0, nq = 0, nr = 0;

  Matrix matrix(int64_t out, int64_t in) {
    Matrix m;
    m.out = out, m.in = in;
    if (int8) {
      m.scale = f ? f + nf : nullptr, nf += out;
      m.q = q ? q + nq : nullptr, nq += out * in;
      m.row_sum = r ? r + nr : nullptr, nr += out;
    } else {
      m.w = f ? f + nf : nullptr, nf += out * in;
    }
    m.b = vec(out);
    return m;
  }
  const float* vec(int64_t n) {
    const float* v = f ? f + nf : nullptr;
    nf += n;
    return v;
  }
};

struct Layer {
  Matrix qkv, o, cq, co, w1, w2;
  const float *norm1_w, *norm1_b, *norm2_w, *norm2_b, *norm3_w, *norm3_b;

  static Layer next(Packed& p, const Dims& m) {
    Layer l;
    const int64_t d = m.d, hv = m.heads * m.dv, hk = m.heads * m.dk;
    l.qkv = p.matrix(m.qkv(), d), l.o = p.matrix(d, hv);
    l.norm1_w = p.vec(d), l.norm1_b = p.vec(d);
    l.cq = p.matrix(hk, d), l.co = p.matrix(d, hv);
    l.norm2_w = p.vec(d), l.norm2_b = p.vec(d);
    l.w1 = p.matrix(m.ff, d), l.w2 = p.matrix(d, m.ff);
    l.norm3_w = p.vec(d), l.norm3_b = p.vec(d);
    return l;
  }
};

struct Model {
  std::vector<Layer> layers;
  const float *final_w, *final_b;
  Matrix generator;

  static Model next(Packed& p, const Dims& m) {
    Model model;
    for (int64_t i = 0; i < m.layers; ++i) model.layers.push_back(Layer::next(p, m));
    model.final_w = p.vec(m.d), model.final_b = p.vec(m.d);
    model.generator = p.matrix(m.vocab, m.d);
    return model;
  }
};

// rows [lo, hi) of lo..n split in four-row steps among the team: this thread's share
inline void share(int64_t n, int64_t& lo, int64_t& hi) {
  const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t per = ((n + threads - 1) / threads + 3) / 4 * 4;
  lo = std::min(n, me * per);
  hi = std::min(n, lo + per);
}

// the sum of a vector's lanes by a tree of shuffles (4 steps, not 15 scalar adds: a step sums
// one per output of every product)
inline float hsum_tree(vf v) {
  v += __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  v += __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  v += __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  v += __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return v[0];
}

inline float dot(const float* __restrict w, const float* __restrict x, int64_t n) {
  vf a{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) a += load(w + i) * load(x + i);
  float s = hsum_tree(a);
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

// y[r, j] = b[j] + x[r, :] . W[j, :] for R input rows from r0 and J rows of W from j0: each
// vector of W read once for the R rows, each of x once for the J. Every output is summed in the
// same order (16 lanes over the vectors of in, their tree, then the tail), whatever R and J:
// a row's result does not depend on the other rows.
template <int R, int J>
inline void block(const float* __restrict w, const float* __restrict b,
                  const float* __restrict x, float* __restrict y, int64_t r0, int64_t j0,
                  int64_t in, int64_t out) {
  const int64_t body = in / kLanes * kLanes;
  vf a[R][J] = {};
  for (int64_t i = 0; i < body; i += kLanes) {
    // W's rows follow each other: 4 KB ahead in the stream, past where the hardware's
    // prefetchers run (4.5% of a greedy search of one sentence, benchmarks/RESULTS.md); an
    // address past W's end is only a hint (a prefetch never faults), made as an integer
    for (int jj = 0; jj < J; ++jj) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(w + (j0 + jj) * in + i) + 4096;
      __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 3);
    }
    vf wv[J];
    for (int jj = 0; jj < J; ++jj) wv[jj] = load(w + (j0 + jj) * in + i);
    for (int rr = 0; rr < R; ++rr) {
      const vf xv = load(x + (r0 + rr) * in + i);
      for (int jj = 0; jj < J; ++jj) a[rr][jj] += wv[jj] * xv;
    }
  }
  for (int rr = 0; rr < R; ++rr) {
    const float* xr = x + (r0 + rr) * in;
    for (int jj = 0; jj < J; ++jj) {
      const float* wj = w + (j0 + jj) * in;
      float s = hsum_tree(a[rr][jj]);
      for (int64_t i = body; i < in; ++i) s += wj[i] * xr[i];
      y[(r0 + rr) * out + j0 + jj] = b[j0 + jj] + s;
    }
  }
}

// the rows r0.. (R of them, 1 to 4) against this thread's rows [lo, hi) of W, four at a time
template <int R>
inline void row_block(const float* w, const float* b, const float* x, float* y, int64_t r0,
                      int64_t lo, int64_t hi, int64_t in, int64_t out) {
  int64_t j = lo;
  for (; j + 4 <= hi; j += 4) block<R, 4>(w, b, x, y, r0, j, in, out);
  for (; j < hi; ++j) block<R, 1>(w, b, x, y, r0, j, in, out);
}

// y (n, out) = x (n, in) W^T + b for this thread's rows of W (out, in): each row of W read once
// for all n inputs, four of W and four inputs at a time
void gemm_rows(const float* __restrict w, const float* __restrict b, const float* __restrict x,
               float* __restrict y, int64_t n, int64_t out, int64_t in) {
  int64_t lo, hi;
  share(out, lo, hi);
  int64_t r = 0;
  for (; r + 4 <= n; r += 4) row_block<4>(w, b, x, y, r, lo, hi, in, out);
  switch (n - r) {
    case 3: row_block<3>(w, b, x, y, r, lo, hi, in, out); break;
    case 2: row_block<2>(w, b, x, y, r, lo, hi, in, out); break;
    case 1: row_block<1>(w, b, x, y, r, lo, hi, in, out); break;
    default: break;
  }
}

// sum_i a_i b_i, a unsigned (k + 128), b signed, exactly in int32
inline int32_t dot_u8s8(const uint8_t* __restrict a, const int8_t* __restrict b, int64_t n) {
  int64_t i = 0;
  int32_t s = 0;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  __m512i acc = _mm512_setzero_si512();
  for (; i + 64 <= n; i += 64) {
    acc = _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(a + i), _mm512_loadu_si512(b + i));
  }
  s = _mm512_reduce_add_epi32(acc);
#else
  typedef uint8_t vu8 __attribute__((vector_size(kLanes)));
  typedef int8_t vs8 __attribute__((vector_size(kLanes)));
  vi acc{};
  for (; i + kLanes <= n; i += kLanes) {
    vu8 x;
    vs8 y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    acc += __builtin_convertvector(x, vi) * __builtin_convertvector(y, vi);
  }
  for (int l = 0; l < kLanes; ++l) s += acc[l];
#endif
  for (; i < n; ++i) s += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return s;
}

// the input rows of an int8 product quantised once (u8 = k + 128, and each row's unit), shared
// by the team
struct Quantised {
  std::vector<uint8_t> rows;
  std::vector<float> units;
};

// y (n, out) = x W^T + b with int8 W for this thread's rows of W, x quantised in qx
void gemm_int8(const Matrix& m, const Quantised& qx, float* y, int64_t n) {
  int64_t lo, hi;
  share(m.out, lo, hi);
  for (int64_t j = lo; j < hi; ++j) {
    const int8_t* wj = m.q + j * m.in;
    for (int64_t r = 0; r < n; ++r) {
      const int32_t sum = dot_u8s8(qx.rows.data() + r * m.in, wj, m.in) - 128 * m.row_sum[j];
      y[r * m.out + j] = m.b[j] + (static_cast<float>(sum) * m.scale[j]) * qx.units[r];
    }
  }
}

// y (n, out) = x (n, in) W^T + b, inside the team; an int8 product quantises x first (one
// thread, a barrier)
void project(const Matrix& m, const float* x, float* y, int64_t n, Quantised& qx) {
  if (m.q == nullptr) {
    gemm_rows(m.w, m.b, x, y, n, m.out, m.in);
    return;
  }
#pragma omp single
  for (int64_t r = 0; r < n; ++r) {  // the engine's int8_rows, shifted to unsigned
    const float* row = x + r * m.in;
    const float unit = qx.units[r] = row_unit(row, m.in);
    uint8_t* q = qx.rows.data() + r * m.in;
    for (int64_t i = 0; i < m.in; ++i) {
      q[i] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(row[i] / unit + 128.0f)));
    }
  }
  gemm_int8(m, qx, y, n);
}

inline float activate(float v, int64_t kind) {
  if (kind == kRelu) return v > 0.0f ? v : 0.0f;
  if (kind == kSwish) return v / (1.0f + std::exp(-v));
  return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));  // GELU, the erf form
}

// this thread's columns of y (rows, n), activated in place (after its own product: no barrier)
void activate_share(float* y, int64_t rows, int64_t n, int64_t kind) {
  int64_t lo, hi;
  share(n, lo, hi);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = lo; j < hi; ++j) y[r * n + j] = activate(y[r * n + j], kind);
  }
}

// y = LayerNorm(x) with weight w and bias b, biased variance (as PyTorch), one thread
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t d, float eps) {
  double mean = 0.0;
  for (int64_t i = 0; i < d; ++i) mean += x[i];
  mean /= d;
  double var = 0.0;
  for (int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float rstd = static_cast<float>(1.0 / std::sqrt(var / d + eps));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m) * rstd * w[i] + b[i];
}

// softmax of p[0..n) in place (max subtracted; -inf entries give 0); n >= 1, one entry finite.
// Vectorised: the exp is vec.h's (within 2 ulp of std::exp), sums in 16 lanes then a tree
void softmax(float* p, int64_t n) {
  const int64_t body = n / kLanes * kLanes, tail = n - body;
  alignas(64) float last[kLanes];  // the tail, padded with -inf
  for (int l = 0; l < kLanes; ++l) last[l] = l < tail ? p[body + l] : -kInf;
  vf mv = load(last);
  for (int64_t j = 0; j < body; j += kLanes) {
    const vf x = load(p + j);
    mv = x > mv ? x : mv;
  }
  const vf m = splat(hmax(mv)), zero{}, minus_inf = splat(-kInf);
  vf sv{};
  for (int64_t j = 0; j < body; j += kLanes) {
    const vf x = load(p + j);
    const vf e = x == minus_inf ? zero : exp_nonpositive(x - m);
    store(p + j, e);
    sv += e;
  }
  const vf x = load(last);
  const vf e = x == minus_inf ? zero : exp_nonpositive(x - m);
  sv += e;
  const vf inv = splat(1.0f / hsum_tree(sv));
  for (int64_t j = 0; j < body; j += kLanes) store(p + j, load(p + j) * inv);
  store(last, e * inv);
  for (int64_t l = 0; l < tail; ++l) p[body + l] = last[l];
}

// out[i] = q . k_i for the 4 keys k0..k3, n a multiple of 16: 16 lanes each, then the
// four trees at once (lane sums in another order than dot's)
inline void dot4(const float* __restrict q, const float* k0, const float* k1, const float* k2,
                 const float* k3, int64_t n, float* out) {
  vf a0{}, a1{}, a2{}, a3{};
  for (int64_t i = 0; i < n; i += kLanes) {
    const vf x = load(q + i);
    a0 += x * load(k0 + i);
    a1 += x * load(k1 + i);
    a2 += x * load(k2 + i);
    a3 += x * load(k3 + i);
  }
  // halves: lanes 0-7 a0's, 8-15 a1's (b: a2, a3); quarters: 4 lanes each of a0..a3
  const vf b01 = __builtin_shuffle(a0, a1, vi{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
                 __builtin_shuffle(a0, a1, vi{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  const vf b23 = __builtin_shuffle(a2, a3, vi{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
                 __builtin_shuffle(a2, a3, vi{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  vf c = __builtin_shuffle(b01, b23, vi{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
         __builtin_shuffle(b01, b23, vi{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  c += __builtin_shuffle(c, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  c += __builtin_shuffle(c, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  out[0] = c[0];
  out[1] = c[4];
  out[2] = c[8];
  out[3] = c[12];
}

// out (C * 16) = sum_j p[j] v_j, value j at value(j): the sums in registers
template <int C, class At>
inline void weighted_sum(const float* p, At value, int64_t n, float* out) {
  vf acc[C] = {};
  for (int64_t j = 0; j < n; ++j) {
    const vf pj = splat(p[j]);
    const float* vj = value(j);
    for (int c = 0; c < C; ++c) acc[c] += pj * load(vj + c * kLanes);
  }
  for (int c = 0; c < C; ++c) store(out + c * kLanes, acc[c]);
}

// out (Dv) = sum_j softmax_j(q . k_j / sqrt(dk) + mask_j) v_j over j < n, key j at key(j),
// value j at value(j) (int64_t -> const float*); scratch holds n floats
template <class KeyAt, class ValueAt>
void attend_at(const float* q, KeyAt key, ValueAt value, int64_t n, int64_t dk, int64_t dv,
               const float* mask, float* scratch, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  int64_t j = 0;
  if (dk % kLanes == 0) {  // four keys at a time, their four sums by one tree
    for (; j + 4 <= n; j += 4) {
      dot4(q, key(j), key(j + 1), key(j + 2), key(j + 3), dk, scratch + j);
      for (int i = 0; i < 4; ++i) {
        scratch[j + i] = scratch[j + i] * scale + (mask ? mask[j + i] : 0.0f);
      }
    }
  }
  for (; j < n; ++j) scratch[j] = dot(q, key(j), dk) * scale + (mask ? mask[j] : 0.0f);
  softmax(scratch, n);
  switch (dv) {  // the usual head sizes: the sums in registers
    case 16: return weighted_sum<1>(scratch, value, n, out);
    case 32: return weighted_sum<2>(scratch, value, n, out);
    case 48: return weighted_sum<3>(scratch, value, n, out);
    case 64: return weighted_sum<4>(scratch, value, n, out);
    case 96: return weighted_sum<6>(scratch, value, n, out);
    case 128: return weighted_sum<8>(scratch, value, n, out);
    default: break;
  }
  for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
  for (j = 0; j < n; ++j) {
    const float pj = scratch[j];
    const float* vj = value(j);
    for (int64_t c = 0; c < dv; ++c) out[c] += pj * vj[c];
  }
}

// attend_at with key j at k + j * k_stride, value j at v + j * v_stride
void attend(const float* q, const float* k, const float* v, int64_t k_stride, int64_t v_stride,
            int64_t n, int64_t dk, int64_t dv, const float* mask, float* scratch, float* out) {
  attend_at(q, [=](int64_t j) { return k + j * k_stride; },
            [=](int64_t j) { return v + j * v_stride; }, n, dk, dv, mask, scratch, out);
}

// the heads (or (row, head) pairs) of this thread: [lo, hi)
inline void head_share(int64_t heads, int64_t& lo, int64_t& hi) {
  const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
  const int64_t per = (heads + threads - 1) / threads;
  lo = std::min(heads, me * per);
  hi = std::min(heads, lo + per);
}

struct Cross {
  bool folded;
  // folded: a (H, D, S), c (H, 1, S), m (H*S, D); else keys (1, H, S, K), values (1, H, S, Dv),
  // mask (S,) additive or null
  const float *a, *c, *m, *keys, *values, *mask;
  int64_t sources;
};

// encoder-decoder attention of y (n, D), the n rows of one sentence, into out (n, D), inside
// the team; scratch holds n H S floats, q n H K, heads_out n H Dv
void cross_attention(const Layer& l, const Dims& m, const Cross& x, const float* y, float* out,
                     int64_t n, float* q, float* heads_out, float* scratch, Quantised& qx) {
  const int64_t d = m.d, s = x.sources, hs = m.heads * s;
  int64_t lo, hi;
  if (x.folded) {
    // scores of row r, head h: c[h, j] + sum_i y[r, i] a[h, i, j], then a softmax; row r's
    // probabilities are scratch[r H S ..], head-major as M's rows
    head_share(m.heads, lo, hi);
    for (int64_t h = lo; h < hi; ++h) {
      const float* ah = x.a + h * d * s;
      for (int64_t r = 0; r < n; ++r) {
        float* p = scratch + r * hs + h * s;
        const float* yr = y + r * d;
        for (int64_t j = 0; j < s; ++j) p[j] = x.c[h * s + j];
        for (int64_t i = 0; i < d; ++i) {
          const float yi = yr[i];
          const float* row = ah + i * s;
          for (int64_t j = 0; j < s; ++j) p[j] += yi * row[j];
        }
        softmax(p, s);
      }
    }
#pragma omp barrier
    // out[r, c] = b[c] + sum_k p[r, k] m[k, c], k over H*S, each thread its columns c
    int64_t c0, c1;
    share(d, c0, c1);
    for (int64_t r = 0; r < n; ++r) {
      float* o = out + r * d;
      const float* p = scratch + r * hs;
      for (int64_t c = c0; c < c1; ++c) o[c] = l.co.b[c];
      for (int64_t k = 0; k < hs; ++k) {
        const float pk = p[k];
        const float* row = x.m + k * d;
        for (int64_t c = c0; c < c1; ++c) o[c] += pk * row[c];
      }
    }
#pragma omp barrier
    return;
  }
  project(l.cq, y, q, n, qx);
#pragma omp barrier
  const int64_t hk = m.heads * m.dk, hv = m.heads * m.dv;
  head_share(n * m.heads, lo, hi);
  for (int64_t pair = lo; pair < hi; ++pair) {  // (row, head)
    const int64_t r = pair / m.heads, h = pair % m.heads;
    attend(q + r * hk + h * m.dk, x.keys + h * s * m.dk, x.values + h * s * m.dv, m.dk, m.dv, s,
           m.dk, m.dv, x.mask, scratch + pair * s, heads_out + r * hv + h * m.dv);
  }
#pragma omp barrier
  project(l.co, heads_out, out, n, qx);
#pragma omp barrier
}

// x (N, D): the step's input (embedding and position) of N hypothesis rows of one sentence;
// weights: packed floats (native_row.py), int8_weights and row_sums empty for float32 weights;
// dims: L, D, H, K, Dv, F, V, activation, pre_norm; kv: 2L buffers (N, capacity, H, K) and
// (N, capacity, H, Dv), position t of each row written; cross: 3L tensors of the sentence,
// folded (A, c, M) or (keys, values, additive mask or an empty tensor) -> logits (N, V)
at::Tensor decoder_row_step(const at::Tensor& x_in, const at::Tensor& weights,
                            const at::Tensor& int8_weights, const at::Tensor& row_sums,
                            at::IntArrayRef dims, at::TensorList kv, int64_t t,
                            at::TensorList cross, bool folded, double eps) {
  TORCH_CHECK(dims.size() == 9, "dims: L, D, H, K, Dv, F, V, activation, pre_norm");
  const Dims m{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7], dims[8]};
  TORCH_CHECK(m.activation >= kRelu && m.activation <= kGelu, "activation: 0, 1 or 2");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(0) >= 1 &&
                  x_in.size(1) == m.d && x_in.is_contiguous(),
              "x must be (N, D) float32, contiguous");
  const int64_t n = x_in.size(0);
  const bool int8 = int8_weights.numel() > 0;
  Packed sizes{nullptr, nullptr, nullptr, int8};
  Model::next(sizes, m);  // counts what the dims take
  TORCH_CHECK(weights.scalar_type() == at::kFloat && weights.is_contiguous() &&
                  weights.numel() == sizes.nf,
              "weights must be the packed float32 tensor of these dims");
  TORCH_CHECK(!int8 || (int8_weights.scalar_type() == at::kChar && int8_weights.is_contiguous() &&
                        int8_weights.numel() == sizes.nq && row_sums.scalar_type() == at::kInt &&
                        row_sums.is_contiguous() && row_sums.numel() == sizes.nr),
              "int8 weights and row sums must be the packed tensors of these dims");
  TORCH_CHECK(static_cast<int64_t>(kv.size()) == 2 * m.layers, "kv: two buffers a layer");
  TORCH_CHECK(static_cast<int64_t>(cross.size()) == 3 * m.layers, "cross: three tensors a layer");
  TORCH_CHECK(!(int8 && folded), "int8 weights are not folded");
  const int64_t d = m.d, hk = m.heads * m.dk, hv = m.heads * m.dv;
  for (int64_t i = 0; i < m.layers; ++i) {
    const at::Tensor &kb = kv[2 * i], &vb = kv[2 * i + 1];
    TORCH_CHECK(kb.is_contiguous() && vb.is_contiguous() && kb.scalar_type() == at::kFloat &&
                    vb.scalar_type() == at::kFloat && kb.dim() == 4 && vb.dim() == 4 &&
                    kb.size(0) == n && vb.size(0) == n && kb.size(1) > t &&
                    kb.size(1) == kv[0].size(1) &&
                    kb.size(2) * kb.size(3) == hk && vb.size(1) == kb.size(1) &&
                    vb.size(2) * vb.size(3) == hv,
                "kv buffers must be (N, capacity > t, H, K) float32, contiguous, one capacity");
  }
  TORCH_CHECK(t >= 0, "t must be >= 0");
  std::vector<Cross> sentences(m.layers);
  int64_t widest = t + 1;
  for (int64_t i = 0; i < m.layers; ++i) {
    const at::Tensor &a = cross[3 * i], &b = cross[3 * i + 1], &c = cross[3 * i + 2];
    Cross& s = sentences[i];
    s.folded = folded;
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.scalar_type() == at::kFloat &&
                    b.scalar_type() == at::kFloat,
                "cross tensors must be float32, contiguous");
    if (folded) {  // a (H, D, S), b = c (H, 1, S), c = M (H*S, D)
      s.sources = a.size(2);
      TORCH_CHECK(a.numel() == m.heads * d * s.sources && b.numel() == m.heads * s.sources &&
                      c.is_contiguous() && c.scalar_type() == at::kFloat &&
                      c.numel() == m.heads * s.sources * d,
                  "folded cross attention: A (H, D, S), c (H, 1, S), M (H*S, D)");
      s.a = a.const_data_ptr<float>(), s.c = b.const_data_ptr<float>();
      s.m = c.const_data_ptr<float>();
    } else {  // a = keys (1, H, S, K), b = values (1, H, S, Dv), c = mask (S,) or empty
      s.sources = a.size(2);
      TORCH_CHECK(a.dim() == 4 && a.numel() == hk * s.sources && b.numel() == hv * s.sources,
                  "cross attention: keys (1, H, S, K), values (1, H, S, Dv)");
      s.keys = a.const_data_ptr<float>(), s.values = b.const_data_ptr<float>();
      TORCH_CHECK(c.numel() == 0 || (c.numel() == s.sources && c.scalar_type() == at::kFloat &&
                                     c.is_contiguous()),
                  "the cross mask must be (S,) float32 or empty");
      s.mask = c.numel() ? c.const_data_ptr<float>() : nullptr;
    }
    TORCH_CHECK(s.sources >= 1, "no source position");
    widest = std::max(widest, s.sources);
  }
  Packed packed{weights.const_data_ptr<float>(),
                int8 ? int8_weights.const_data_ptr<int8_t>() : nullptr,
                int8 ? row_sums.const_data_ptr<int32_t>() : nullptr, int8};
  const Model model = Model::next(packed, m);
  const int64_t capacity = kv[0].size(1);
  at::Tensor logits = at::empty({n, m.vocab}, x_in.options());
  // working rows (n of each): x, y (normed or summed), q/k/v, the heads' outputs, the FFN's
  // hidden layer, a sublayer's output, encoder-decoder queries; attention scores
  std::vector<float> x(x_in.const_data_ptr<float>(), x_in.const_data_ptr<float>() + n * d);
  std::vector<float> y(n * d), qkv(n * m.qkv()), heads_out(n * hv), hidden(n * m.ff);
  std::vector<float> sub(n * d), q(n * hk), scratch(n * m.heads * widest);
  Quantised qx;
  qx.rows.resize(n * std::max({d, hv, m.ff}));
  qx.units.resize(n);
  const float fe = static_cast<float>(eps);
  const bool pre = m.pre_norm != 0;
  // the sublayer's input: LN(x) before (pre-norm), x itself after (post-norm); one thread
  auto begin = [&](const float* nw, const float* nb) {
    if (!pre) {
      std::copy(x.begin(), x.end(), y.begin());
      return;
    }
    for (int64_t r = 0; r < n; ++r) layer_norm(&x[r * d], nw, nb, &y[r * d], d, fe);
  };
  // x + sub, then LN after (post-norm); one thread
  auto end = [&](const float* nw, const float* nb) {
    for (int64_t i = 0; i < n * d; ++i) x[i] += sub[i];
    if (pre) return;
    for (int64_t r = 0; r < n; ++r) layer_norm(&x[r * d], nw, nb, &x[r * d], d, fe);
  };
  float* out = logits.mutable_data_ptr<float>();
#pragma omp parallel num_threads(at::get_num_threads())
  {
    for (int64_t i = 0; i < m.layers; ++i) {
      const Layer& l = model.layers[i];
      float* kb = kv[2 * i].mutable_data_ptr<float>();
      float* vb = kv[2 * i + 1].mutable_data_ptr<float>();
#pragma omp single
      begin(l.norm1_w, l.norm1_b);
      project(l.qkv, y.data(), qkv.data(), n, qx);
#pragma omp barrier
#pragma omp single
      for (int64_t r = 0; r < n; ++r) {  // the new position's keys and values into the cache,
        const float* row = qkv.data() + r * m.qkv();  // position-major rows of H*K
        std::copy(row + hk, row + 2 * hk, kb + (r * capacity + t) * hk);
        std::copy(row + 2 * hk, row + m.qkv(), vb + (r * capacity + t) * hv);
      }
      int64_t lo, hi;
      head_share(n * m.heads, lo, hi);
      for (int64_t pair = lo; pair < hi; ++pair) {  // (row, head)
        const int64_t r = pair / m.heads, h = pair % m.heads;
        attend(qkv.data() + r * m.qkv() + h * m.dk, kb + r * capacity * hk + h * m.dk,
               vb + r * capacity * hv + h * m.dv, hk, hv, t + 1, m.dk, m.dv, nullptr,
               scratch.data() + pair * widest, heads_out.data() + r * hv + h * m.dv);
      }
#pragma omp barrier
      project(l.o, heads_out.data(), sub.data(), n, qx);
#pragma omp barrier
#pragma omp single
      {
        end(l.norm1_w, l.norm1_b);
        begin(l.norm2_w, l.norm2_b);
      }
      cross_attention(l, m, sentences[i], y.data(), sub.data(), n, q.data(), heads_out.data(),
                      scratch.data(), qx);
#pragma omp single
      {
        end(l.norm2_w, l.norm2_b);
        begin(l.norm3_w, l.norm3_b);
      }
      project(l.w1, y.data(), hidden.data(), n, qx);
      activate_share(hidden.data(), n, m.ff, m.activation);
#pragma omp barrier
      project(l.w2, hidden.data(), sub.data(), n, qx);
#pragma omp barrier
#pragma omp single
      end(l.norm3_w, l.norm3_b);
    }
#pragma omp single
    if (pre) {
      for (int64_t r = 0; r < n; ++r) {
        layer_norm(&x[r * d], model.final_w, model.final_b, &x[r * d], d, fe);
      }
    }
    project(model.generator, x.data(), out, n, qx);
  }
  return logits;
}

// softmax(q k^T / sqrt(K) + mask) v for a few queries: q (B, H, T, K), k (B, H, S, K), v (B, H,
// S, Dv), any strides with the last dimension's 1; mask (B, H, T, S) bool (True = may attend;
// strides 0 where broadcast) or empty -> (B, H, T, Dv), zeros where a query may attend nothing
// (as zero weights). A search's step: (row, head) pairs on the threads, one pass over its keys.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-dimensional");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "q, k, v must be float32");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "q, k, v must have a contiguous last dimension");
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dk = q.size(3);
  const int64_t s = k.size(2), dv = v.size(3);
  TORCH_CHECK(k.size(0) == b && k.size(1) == h && k.size(3) == dk && v.size(0) == b &&
                  v.size(1) == h && v.size(2) == s,
              "k (B, H, S, K) and v (B, H, S, Dv) must match q (B, H, T, K)");
  const bool masked = mask.numel() > 0;
  TORCH_CHECK(!masked || (mask.scalar_type() == at::kBool && mask.dim() == 4 &&
                          mask.size(0) == b && mask.size(1) == h && mask.size(2) == t &&
                          mask.size(3) == s),
              "mask must be (B, H, T, S) bool or empty");
  // (B, T, H, Dv) in memory, handed out as its (B, H, T, Dv) view: the caller's merge of the
  // heads, out.transpose(1, 2).reshape(B * T, H * Dv), is then a view rather than a copy
  at::Tensor out = at::empty({b, t, h, dv}, q.options());
  const float *qp = q.const_data_ptr<float>(), *kp = k.const_data_ptr<float>();
  const float* vp = v.const_data_ptr<float>();
  const bool* mp = masked ? mask.const_data_ptr<bool>() : nullptr;
  float* op = out.mutable_data_ptr<float>();
  at::parallel_for(0, b * h, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(s), add(s);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t i = pair / h, j = pair % h;
      const float* kb = kp + i * k.stride(0) + j * k.stride(1);
      const float* vb = vp + i * v.stride(0) + j * v.stride(1);
      for (int64_t r = 0; r < t; ++r) {
        const float* qr = qp + i * q.stride(0) + j * q.stride(1) + r * q.stride(2);
        float* o = op + ((i * t + r) * h + j) * dv;
        bool any = !masked;
        if (masked) {
          const bool* mr = mp + i * mask.stride(0) + j * mask.stride(1) + r * mask.stride(2);
          for (int64_t c = 0; c < s; ++c) {
            const bool ok = mr[c * mask.stride(3)];
            add[c] = ok ? 0.0f : -kInf;
            any = any || ok;
          }
        }
        if (!any) {
          std::fill(o, o + dv, 0.0f);
          continue;
        }
        attend(qr, kb, vb, k.stride(2), v.stride(2), s, dk, dv, masked ? add.data() : nullptr,
               scores.data(), o);
      }
    }
  });
  return out.permute({0, 2, 1, 3});  // (B, T, H, Dv) -> (B, H, T, Dv)
}

// A search step's self-attention on a cache whose rows were never gathered: q (N, H, 1, K),
// the step's keys k_new (N, H, 1, K) and values v_new (N, H, 1, Dv) (last dimension
// contiguous, other strides any) written at position t of rows 0..N-1 of the buffers kb (R,
// capacity, H, K) and vb (R, capacity, H, Dv) (contiguous, R >= N, capacity > t); lineage (N,
// L) int64, L > t, row-contiguous: position p < t of hypothesis i lies in row lineage[i, p],
// position t in row i (written into lineage[i, t] here). -> (N, H, 1, Dv): hypothesis i's query
// over its t + 1 positions, as decode_attention over the gathered cache gives.
at::Tensor cached_self_attention(const at::Tensor& q, const at::Tensor& k_new,
                                 const at::Tensor& v_new, const at::Tensor& kb,
                                 const at::Tensor& vb, const at::Tensor& lineage, int64_t t) {
  TORCH_CHECK(q.dim() == 4 && k_new.dim() == 4 && v_new.dim() == 4 && kb.dim() == 4 &&
                  vb.dim() == 4 && lineage.dim() == 2,
              "q, k_new, v_new, kb, vb must be 4-dimensional, lineage 2-dimensional");
  for (const at::Tensor* x : {&q, &k_new, &v_new, &kb, &vb}) {
    TORCH_CHECK(x->scalar_type() == at::kFloat, "q, k_new, v_new, kb, vb must be float32");
  }
  TORCH_CHECK(q.stride(3) == 1 && k_new.stride(3) == 1 && v_new.stride(3) == 1,
              "q, k_new, v_new must have a contiguous last dimension");
  TORCH_CHECK(kb.is_contiguous() && vb.is_contiguous(), "kb, vb must be contiguous");
  TORCH_CHECK(lineage.scalar_type() == at::kLong && lineage.stride(1) == 1,
              "lineage must be int64 with contiguous rows");
  const int64_t n = q.size(0), h = q.size(1), dk = q.size(3), dv = v_new.size(3);
  const int64_t rows = kb.size(0), capacity = kb.size(1);
  TORCH_CHECK(q.size(2) == 1 && k_new.size(2) == 1 && v_new.size(2) == 1,
              "one query, key and value a row");
  TORCH_CHECK(k_new.size(0) == n && k_new.size(1) == h && k_new.size(3) == dk &&
                  v_new.size(0) == n && v_new.size(1) == h,
              "k_new (N, H, 1, K) and v_new (N, H, 1, Dv) must match q (N, H, 1, K)");
  TORCH_CHECK(kb.size(2) == h && kb.size(3) == dk && vb.size(0) == rows &&
                  vb.size(1) == capacity && vb.size(2) == h && vb.size(3) == dv,
              "kb (R, capacity, H, K) and vb (R, capacity, H, Dv) must match q");
  TORCH_CHECK(t >= 0 && t < capacity && n <= rows, "position t past the buffers' capacity, or "
              "more rows than the buffers hold");
  TORCH_CHECK(lineage.size(0) == n && lineage.size(1) > t, "lineage must be (N, L), L > t");
  int64_t* lin = lineage.mutable_data_ptr<int64_t>();
  const int64_t ls = lineage.stride(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < t; ++p) {
      TORCH_CHECK(lin[i * ls + p] >= 0 && lin[i * ls + p] < rows, "lineage holds a row out of range");
    }
    lin[i * ls + t] = i;
  }
  at::Tensor out = at::empty({n, h, 1, dv}, q.options());
  const float *qp = q.const_data_ptr<float>(), *knp = k_new.const_data_ptr<float>();
  const float* vnp = v_new.const_data_ptr<float>();
  float *kp = kb.mutable_data_ptr<float>(), *vp = vb.mutable_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t hk = h * dk, hv = h * dv;  // a position's floats in kb, vb
  at::parallel_for(0, n * h, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(t + 1);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t i = pair / h, j = pair % h;
      const int64_t* li = lin + i * ls;
      // this head's slice of position t of row i: written by this pair alone
      float* kt = kp + (i * capacity + t) * hk + j * dk;
      float* vt = vp + (i * capacity + t) * hv + j * dv;
      std::memcpy(kt, knp + i * k_new.stride(0) + j * k_new.stride(1), dk * sizeof(float));
      std::memcpy(vt, vnp + i * v_new.stride(0) + j * v_new.stride(1), dv * sizeof(float));
      attend_at(
          qp + i * q.stride(0) + j * q.stride(1),
          [=](int64_t p) { return kp + (li[p] * capacity + p) * hk + j * dk; },
          [=](int64_t p) { return vp + (li[p] * capacity + p) * hv + j * dv; }, t + 1, dk, dv,
          nullptr, scores.data(), op + (i * h + j) * dv);
    }
  });
  return out;
}

}  // namespace

namespace {

// A beam's reorder of one sentence's rows in the buffers its native steps write: row i of each
// buffer (rows, capacity, H, size) takes positions 0 .. t-1 of row index[i], every source read
// before any row is written, rows with index[i] == i untouched -> the number of rows moved.
// One call where PyTorch takes a gather and a scatter a buffer (2 a layer).
int64_t reorder_row_buffers(const std::vector<at::Tensor>& buffers, const at::Tensor& index_in,
                            int64_t t) {
  TORCH_CHECK(index_in.dim() == 1 && index_in.scalar_type() == at::kLong &&
                  index_in.device().is_cpu(),
              "index must be (N,) int64 on the CPU");
  TORCH_CHECK(t >= 0, "t must not be negative");
  const at::Tensor index = index_in.contiguous();
  const int64_t n = index.size(0);
  const int64_t* ip = index.const_data_ptr<int64_t>();
  std::vector<int64_t> moved;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(ip[i] >= 0 && ip[i] < n, "index must hold rows 0 .. N-1");
    if (ip[i] != i) moved.push_back(i);
  }
  for (const at::Tensor& b : buffers) {  // every buffer checked before any is written
    TORCH_CHECK(b.dim() == 4 && b.device().is_cpu() && b.size(0) >= n && b.size(1) >= t,
                "each buffer must be (rows >= N, capacity >= t, H, size) on the CPU");
    TORCH_CHECK(b.stride(3) == 1 && b.stride(2) == b.size(3) &&
                    b.stride(1) == b.size(2) * b.size(3) && b.stride(0) >= b.size(1) * b.stride(1),
                "a buffer's row must hold its positions in one block of its own");
  }
  if (moved.empty() || t == 0) return static_cast<int64_t>(moved.size());
  std::vector<char> held;
  for (const at::Tensor& b : buffers) {
    const int64_t item = b.element_size();
    const int64_t block = t * b.stride(1) * item;  // bytes of a row's t positions
    const int64_t row = b.stride(0) * item;
    char* base = static_cast<char*>(b.data_ptr());
    held.resize(moved.size() * block);
    for (size_t j = 0; j < moved.size(); ++j) {
      std::memcpy(held.data() + j * block, base + ip[moved[j]] * row, block);
    }
    for (size_t j = 0; j < moved.size(); ++j) {
      std::memcpy(base + moved[j] * row, held.data() + j * block, block);
    }
  }
  return static_cast<int64_t>(moved.size());
}

}  // namespace

namespace transduce_native_api {
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask) {
  return ::decode_attention(q, k, v, mask);
}
at::Tensor cached_self_attention(const at::Tensor& q, const at::Tensor& k_new,
                                 const at::Tensor& v_new, const at::Tensor& kb,
                                 const at::Tensor& vb, const at::Tensor& lineage, int64_t t) {
  return ::cached_self_attention(q, k_new, v_new, kb, vb, lineage, t);
}
}  // namespace transduce_native_api

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("decoder_row_step(Tensor x, Tensor weights, Tensor int8_weights, Tensor row_sums, "
        "int[] dims, Tensor[] kv, int t, Tensor[] cross, bool folded, float eps) -> Tensor",
        decoder_row_step);
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask) -> Tensor", decode_attention);
  m.def("reorder_row_buffers(Tensor(a!)[] buffers, Tensor index, int t) -> int",
        reorder_row_buffers);
  m.def("cached_self_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) kb, Tensor(b!) vb, "
        "Tensor(c!) lineage, int t) -> Tensor",
        cached_self_attention);
}
