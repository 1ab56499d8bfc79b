// A batch's decoder step in one call: every decoder layer and the pre-softmax projection for
// the N hypothesis rows of a search that attends through the engine's lineage table, float32
// products in the engine's layouts (inference/engine/batch_step.py). The operators, their
// arguments and their order are those of the engine's step in Python (DecodingModel._layer),
// so the logits are the same numbers; the call saves the ~40 Python calls a layer between them.
//
// Shapes: N = B * G rows (G hypotheses of each of B sentences, sentence-major), D model width,
// H heads of K (= Dv) floats, S source positions, V the vocabulary.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "api.h"

#include <cstdint>
#include <string>
#include <vector>

namespace {

namespace api = transduce_native_api;

// What each layer holds in ``weights`` and ``biases``, in this order
enum Proj : int64_t { kQkv, kSelfOut, kCrossQuery, kCrossOut, kFfnIn, kFfnOut, kProjs };

// The FFN's activation (model/feed_forward.py's ACTIVATIONS): F.relu, F.silu, F.gelu (erf)
enum Activation : int64_t { kRelu, kSwish, kGelu };

// A product's library (kernels/projection.py's layouts for many rows): our kernel on W's panels,
// oneDNN's inner product on W in its own layout, MKL's addmm on W^T (in, out)
enum Kind : int64_t { kPanels, kOnednn, kMkl };

// x W^T + b by oneDNN, as kernels.matmul.onednn_linear calls it (a boxed call: its schema's
// optional arguments)
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack;
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(b.numel() > 0 ? c10::IValue(b) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  return at::layer_norm(x, {x.size(1)}, w, b, eps);
}

// x (N, D) the step's input (embedding and position); weights, biases and kinds: kProjs a
// layer then the pre-softmax projection's, each W in its library's layout (``Kind``), biases
// (out,) or empty; outs: each product's output count in the same order; norms: per layer three (weight, bias) pairs, then the final norm's (pre-norm
// only: empty tensors after post-norm layers); kv: per layer the buffers (R, capacity, H, K)
// and (R, capacity, H, K); lineage (N, L) and t as cached_self_attention takes them; cross:
// per layer keys and values (B, H, S, K); mask (B, 1, 1, S) bool or empty; dims: L, H, K,
// pre_norm, the FFN's activation (``Activation``) -> logits (N, V)
at::Tensor decoder_batch_step(const at::Tensor& x_in, at::TensorList weights,
                              at::TensorList biases, at::IntArrayRef kinds, at::IntArrayRef outs,
                              at::TensorList norms, at::TensorList kv, const at::Tensor& lineage,
                              int64_t t, at::TensorList cross, const at::Tensor& mask,
                              at::IntArrayRef dims, double eps) {
  TORCH_CHECK(dims.size() == 5, "dims: L, H, K, pre_norm, activation");
  const int64_t layers = dims[0], h = dims[1], dk = dims[2], activation = dims[4];
  TORCH_CHECK(layers >= 1, "one decoder layer or more");
  TORCH_CHECK(activation >= kRelu && activation <= kGelu, "activation: 0, 1 or 2");
  const bool pre = dims[3] != 0;
  const int64_t projs = layers * kProjs + 1;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == projs &&
                  static_cast<int64_t>(biases.size()) == projs &&
                  static_cast<int64_t>(kinds.size()) == projs &&
                  static_cast<int64_t>(outs.size()) == projs,
              "weights, biases, kinds and outs: 6 a layer, then the pre-softmax projection's");
  for (const int64_t kind : kinds) {
    TORCH_CHECK(kind >= kPanels && kind <= kMkl, "kinds: 0 (panels), 1 (oneDNN) or 2 (MKL)");
  }
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 6 * layers + 2, "norms: 6 a layer, then 2");
  TORCH_CHECK(static_cast<int64_t>(kv.size()) == 2 * layers &&
                  static_cast<int64_t>(cross.size()) == 2 * layers,
              "kv and cross: 2 a layer");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "x must be (N, D) float32");
  const int64_t n = x_in.size(0), b = cross[0].size(0);
  TORCH_CHECK(b >= 1 && n % b == 0, "N rows must be G rows of each of B sentences");
  const int64_t g = n / b, s = cross[0].size(2);
  const bool masked = mask.numel() > 0;
  const at::Tensor m = masked ? mask.expand({b, h, g, s}) : mask;  // a view
  // the engine's Projection for many rows: ReLU in the call on the panels, else after it
  auto product = [&](const at::Tensor& x, int64_t i, bool relu) {
    if (kinds[i] == kPanels) return api::f32_linear(x, weights[i], biases[i], outs[i], relu);
    at::Tensor y = kinds[i] == kOnednn            ? onednn_linear(x, weights[i], biases[i])
                   : biases[i].numel() > 0 ? at::addmm(biases[i], x, weights[i])
                                                  : at::mm(x, weights[i]);
    return relu ? y.relu_() : y;
  };
  // post-norm: LN(x + f(x)); pre-norm: x + f(LN(x)), norm ``j`` of layer ``l``
  auto input = [&](const at::Tensor& x, int64_t l, int64_t j) {
    return pre ? norm(x, norms[6 * l + 2 * j], norms[6 * l + 2 * j + 1], eps) : x;
  };
  auto output = [&](const at::Tensor& x, const at::Tensor& f, int64_t l, int64_t j) {
    const at::Tensor sum = x + f;
    return pre ? sum : norm(sum, norms[6 * l + 2 * j], norms[6 * l + 2 * j + 1], eps);
  };
  at::Tensor x = x_in;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t p = l * kProjs;
    // self-attention: the step's keys and values written at position t, the query over its
    // row's positions where the lineage table places them
    at::Tensor qkv = product(input(x, l, 0), p + kQkv, false);  // (N, 3 H K)
    std::vector<at::Tensor> parts = qkv.view({n, 3, h, 1, dk}).unbind(1);  // 3 x (N, H, 1, K)
    at::Tensor heads =
        api::cached_self_attention(parts[0], parts[1], parts[2], kv[2 * l], kv[2 * l + 1],
                                   lineage, t);  // (N, H, 1, K)
    x = output(x, product(heads.reshape({n, h * dk}), p + kSelfOut, false), l, 0);
    // encoder-decoder attention: a sentence's G rows query its keys together
    at::Tensor q = product(input(x, l, 1), p + kCrossQuery, false)
                       .view({b, g, h, dk})
                       .transpose(1, 2);  // (N, H K) -> (B, H, G, K)
    at::Tensor c = api::decode_attention(q, cross[2 * l], cross[2 * l + 1], m);  // (B, H, G, K)
    c = c.transpose(1, 2).reshape({n, h * dk});  // (B, G, H, K) -> (N, H K): a view
    x = output(x, product(c, p + kCrossOut, false), l, 1);
    // the position-wise FFN: ReLU in the first product's call, the others after it
    at::Tensor hidden = product(input(x, l, 2), p + kFfnIn, activation == kRelu);  // (N, F)
    if (activation == kSwish) hidden = at::silu(hidden);
    if (activation == kGelu) hidden = at::gelu(hidden);
    x = output(x, product(hidden, p + kFfnOut, false), l, 2);
  }
  if (pre) x = norm(x, norms[6 * layers], norms[6 * layers + 1], eps);
  return product(x, layers * kProjs, false);  // (N, V)
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(transduce_native, m) {
  m.def("decoder_batch_step(Tensor x, Tensor[] weights, Tensor[] biases, int[] kinds, "
        "int[] outs, Tensor[] norms, Tensor(a!)[] kv, Tensor(b!) lineage, int t, "
        "Tensor[] cross, Tensor mask, int[] dims, float eps) -> Tensor",
        decoder_batch_step);
}
