// int8 products on AMX's tiles for the inference engine's many-row products
// (kernels/quantized.py): y = b + ((float) sum_k q_ik w_jk * s_j) * u_i, each input row i
// quantised on the way in as int8_rows does (k = nearbyint(x / u + 128) - 128, u = max |x| /
// 127), the sums exact in int32 (TDPBSSD: signed by signed bytes), then the float32 steps in
// the order fbgemm's and oneDNN's kernels and PyTorch's addcmul take them, each rounded on its
// own, but for b + t u, which PyTorch's addcmul computes as one fused multiply-add: the numbers
// of quantized.fbgemm_linear_rows, bit for bit.
//
// W comes packed once (amx_int8_pack): 16 output channels by 64 inputs a tile, in the tile's
// VNNI order (4 consecutive inputs of a channel side by side), zeros past the weight's edges.
// A call quantises x into a buffer of 16-row, 64-column tiles, then each thread computes its
// share of the output's 16-column blocks, two by two, for all rows (two row blocks at a time:
// four accumulator tiles).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/library.h>

#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TRANSDUCE_AMX 1
#else
#define TRANSDUCE_AMX 0
#endif

namespace {

using namespace transduce_vec;

constexpr int64_t kRows = 16;   // a tile's rows
constexpr int64_t kDepth = 64;  // a tile's bytes a row: 64 inputs of A, 16 x 4 of B

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

#if TRANSDUCE_AMX
// Linux hands out AMX's tile data only to a process that asked for it (once, for all threads)
bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3 accumulate (16 x 16 int32), 4-5 hold A (16 x 64 int8), 6-7 B (16 x 64 int8)
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}
#endif

#if TRANSDUCE_AMX
// the float32 steps of one 16 x 16 block of sums c (row-major, 16 a row) into y (rows i0.., the
// columns j0..j0 + cols): ((float) c * s_j) * u_i, then + b_j
void finish_block(const int32_t* c, const float* scale, const float* bias, const float* units,
                  float* y, int64_t ld, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  alignas(64) float s[kLanes], b[kLanes], row[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    s[l] = l < cols ? scale[j0 + l] : 0.0f;
    b[l] = (bias != nullptr && l < cols) ? bias[j0 + l] : 0.0f;
  }
  const vf sv = load(s), bv = load(b);
  for (int64_t r = 0; r < rows; ++r) {
    vi ci;
    std::memcpy(&ci, c + r * kLanes, sizeof ci);
    vf t = __builtin_convertvector(ci, vf) * sv;
    asm("" : "+v"(t));  // rounded before the next step: the compiler may not fuse them
    if (bias != nullptr) {  // addcmul: b + t u in one rounding, as PyTorch's kernel fuses it
      t = (vf)_mm512_fmadd_ps((__m512)t, (__m512)splat(units[i0 + r]), (__m512)bv);
    } else {  // mul_: t u
      t = t * splat(units[i0 + r]);
    }
    if (cols == kLanes) {
      store(y + (i0 + r) * ld + j0, t);
    } else {
      store(row, t);
      std::memcpy(y + (i0 + r) * ld + j0, row, cols * sizeof(float));
    }
  }
}

#endif

// W (out, in) int8 -> (ceil(out / 16), ceil(in / 64), 16, 64) int8: B tiles, (channel block
// n, input block kc), row kk of a tile holding inputs 4kk..4kk+3 of its 16 channels in turn
at::Tensor amx_int8_pack(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.dim() == 2 && w_in.scalar_type() == at::kChar, "W must be (out, in) int8");
  at::Tensor w = w_in.contiguous();
  const int64_t out = w.size(0), in = w.size(1);
  const int64_t nb = round_up(out, kRows) / kRows, kb = round_up(in, kDepth) / kDepth;
  at::Tensor packed = at::zeros({nb, kb, kRows, kDepth}, w.options());
  const int8_t* wp = w.const_data_ptr<int8_t>();
  int8_t* pp = packed.mutable_data_ptr<int8_t>();
  for (int64_t j = 0; j < out; ++j) {
    for (int64_t k = 0; k < in; ++k) {
      const int64_t n = j / kRows, col = j % kRows, kc = k / kDepth, kk = (k % kDepth) / 4;
      pp[((n * kb + kc) * kRows + kk) * kDepth + col * 4 + k % 4] = wp[j * in + k];
    }
  }
  return packed;
}

bool amx_int8_available() {
#if TRANSDUCE_AMX
  return amx_permitted();
#else
  return false;
#endif
}

// x (N, in) float32, packed (amx_int8_pack of W (out, in)), scale (out,) float32, bias (out,)
// float32 or empty -> y (N, out) float32
at::Tensor amx_int8_linear(const at::Tensor& x_in, const at::Tensor& packed,
                           const at::Tensor& scale, const at::Tensor& bias, int64_t out) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "x must be (N, in) float32 on the CPU");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kChar && packed.is_contiguous() &&
                  packed.size(2) == kRows && packed.size(3) == kDepth,
              "packed must come from amx_int8_pack");
  const int64_t n = x_in.size(0), in = x_in.size(1);
  const int64_t nb = packed.size(0), kb = packed.size(1);
  TORCH_CHECK(kb == round_up(in, kDepth) / kDepth && nb == round_up(out, kRows) / kRows,
              "packed W does not fit x's width or out");
  TORCH_CHECK(scale.numel() == out && scale.scalar_type() == at::kFloat && scale.is_contiguous(),
              "scale must be (out,) float32");
  const bool biased = bias.numel() > 0;
  TORCH_CHECK(!biased || (bias.numel() == out && bias.scalar_type() == at::kFloat &&
                          bias.is_contiguous()),
              "bias must be (out,) float32 or empty");
#if TRANSDUCE_AMX
  TORCH_CHECK(amx_permitted(), "this process may not use AMX's tiles");
  at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty({n, out}, x.options());
  if (n == 0) return y;
  const int64_t kp = kb * kDepth, mp = round_up(n, kRows), mb = mp / kRows;
  // x quantised, 16-row blocks of kp columns, zeros past its edges
  std::vector<int8_t> a(mp * kp, 0);
  std::vector<float> units(n);
  const float* xp = x.const_data_ptr<float>();
  const int8_t* bp = packed.const_data_ptr<int8_t>();
  const float* sp = scale.const_data_ptr<float>();
  const float* biasp = biased ? bias.const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  const int64_t pairs = (nb + 1) / 2;  // column blocks two at a time
#pragma omp parallel num_threads(at::get_num_threads())
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t i = me; i < n; i += threads) {
      const float* row = xp + i * in;
      const float unit = row_unit(row, in);
      units[i] = unit;
      int8_t* q = a.data() + i * kp;
      for (int64_t j = 0; j < in; ++j) {
        const float k = std::nearbyint(row[j] / unit + 128.0f) - 128.0f;
        q[j] = static_cast<int8_t>(static_cast<int32_t>(k));
      }
    }
#pragma omp barrier
    configure_tiles();
    alignas(64) int32_t c[4][kRows * kRows];
    const int64_t per = (pairs + threads - 1) / threads;
    const int64_t lo = std::min(pairs, me * per), hi = std::min(pairs, lo + per);
    // W's column pairs a chunk at a time (~256 KB of W, kept in the L2 cache), every row block
    // over the chunk: each row's outputs written in runs of the chunk's columns
    const int64_t chunk = std::max<int64_t>(1, (256 * 1024) / (2 * kb * kRows * kDepth));
    for (int64_t c0 = lo; c0 < hi; c0 += chunk)
    for (int64_t m0 = 0; m0 < mb; m0 += 2)
    for (int64_t p = c0; p < std::min(hi, c0 + chunk); ++p) {
      const int64_t n0 = 2 * p;
      const bool two = n0 + 1 < nb;
      const int8_t* b0 = bp + n0 * kb * kRows * kDepth;
      const int8_t* b1 = b0 + kb * kRows * kDepth;
      {
        const bool two_rows = m0 + 1 < mb;
        const int8_t* a0 = a.data() + m0 * kRows * kp;
        const int8_t* a1 = a0 + kRows * kp;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kc = 0; kc < kb; ++kc) {
          _tile_loadd(4, a0 + kc * kDepth, kp);
          _tile_loadd(6, b0 + kc * kRows * kDepth, kDepth);
          _tile_dpbssd(0, 4, 6);
          if (two) {
            _tile_loadd(7, b1 + kc * kRows * kDepth, kDepth);
            _tile_dpbssd(1, 4, 7);
          }
          if (two_rows) {
            _tile_loadd(5, a1 + kc * kDepth, kp);
            _tile_dpbssd(2, 5, 6);
            if (two) _tile_dpbssd(3, 5, 7);
          }
        }
        _tile_stored(0, c[0], kRows * 4);
        if (two) _tile_stored(1, c[1], kRows * 4);
        if (two_rows) _tile_stored(2, c[2], kRows * 4);
        if (two && two_rows) _tile_stored(3, c[3], kRows * 4);
        for (int t = 0; t < 4; ++t) {
          const int64_t mi = m0 + t / 2, nj = n0 + t % 2;
          if (mi >= mb || nj >= nb) continue;
          const int64_t i0 = mi * kRows, j0 = nj * kRows;
          finish_block(c[t], sp, biasp, units.data(), yp, out, i0, std::min(kRows, n - i0), j0,
                       std::min(kRows, out - j0));
        }
      }
    }
    _tile_release();
  }
  return y;
#else
  TORCH_CHECK(false, "built without AMX's int8 tiles");
  return at::Tensor();
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("amx_int8_available() -> bool", amx_int8_available);
  m.def("amx_int8_pack(Tensor w) -> Tensor", amx_int8_pack);
  m.def("amx_int8_linear(Tensor x, Tensor packed, Tensor scale, Tensor bias, int out) -> Tensor",
        amx_int8_linear);
}
