// The operators that other sources call directly rather than through PyTorch's dispatcher
// (batch_step.cpp): each defined in its own source, after that source's anonymous namespace.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace transduce_native_api {

// f32_gemm.cpp: y (N, out) = x W^T + b on W's panels, ReLU'd where ``relu``
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias,
                      int64_t out, bool relu);

// decoder_row.cpp: a search step's attention of few queries (B, H, T, K) over (B, H, S, K)
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask);

// decoder_row.cpp: a step's self-attention through the lineage table
at::Tensor cached_self_attention(const at::Tensor& q, const at::Tensor& k_new,
                                 const at::Tensor& v_new, const at::Tensor& kb,
                                 const at::Tensor& vb, const at::Tensor& lineage, int64_t t);

}  // namespace transduce_native_api
