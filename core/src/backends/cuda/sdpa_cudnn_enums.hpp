// sdpa_graph.hpp's data types and pointwise modes as cuDNN's backend API names them: one table
// each, read one way by the emitter (cudnn_attention.cpp) and the other by the cuDNN stand-in
// (tests/cudnn_standin), so the two cannot disagree. Includes cuDNN's graph header.
#pragma once
#include <cudnn_graph.h>

#include <optional>
#include <utility>

#include "backends/cuda/sdpa_graph.hpp"

namespace strata::cuda {

inline constexpr std::pair<SdpaType, cudnnDataType_t> kSdpaCudnnTypes[] = {
    {SdpaType::f32, CUDNN_DATA_FLOAT},
    {SdpaType::bf16, CUDNN_DATA_BFLOAT16},
    {SdpaType::i32, CUDNN_DATA_INT32},
    {SdpaType::boolean, CUDNN_DATA_BOOLEAN},
};

inline constexpr std::pair<SdpaPointwise, cudnnPointwiseMode_t> kSdpaCudnnPointwise[] = {
    {SdpaPointwise::add, CUDNN_POINTWISE_ADD},
    {SdpaPointwise::sub, CUDNN_POINTWISE_SUB},
    {SdpaPointwise::mul, CUDNN_POINTWISE_MUL},
    {SdpaPointwise::div, CUDNN_POINTWISE_DIV},
    {SdpaPointwise::exp, CUDNN_POINTWISE_EXP},
    {SdpaPointwise::log, CUDNN_POINTWISE_LOG},
    {SdpaPointwise::identity, CUDNN_POINTWISE_IDENTITY},
    {SdpaPointwise::gen_index, CUDNN_POINTWISE_GEN_INDEX},
    {SdpaPointwise::cmp_ge, CUDNN_POINTWISE_CMP_GE},
    {SdpaPointwise::select, CUDNN_POINTWISE_BINARY_SELECT},
};

// cuDNN's name of `value` (every SdpaType and SdpaPointwise has one).
template <class Sdpa, class Cudnn, std::size_t N>
constexpr Cudnn cudnn_name(const std::pair<Sdpa, Cudnn> (&table)[N], Sdpa value) {
  for (const auto& [sdpa, cudnn] : table)
    if (sdpa == value) return cudnn;
  return table[0].second;  // unreachable: the tables list every enumerator
}

// The SdpaType or SdpaPointwise cuDNN's `value` names; none for one sdpa_graph.hpp has no use for.
template <class Sdpa, class Cudnn, std::size_t N>
constexpr std::optional<Sdpa> sdpa_name(const std::pair<Sdpa, Cudnn> (&table)[N], Cudnn value) {
  for (const auto& [sdpa, cudnn] : table)
    if (cudnn == value) return sdpa;
  return std::nullopt;
}

}  // namespace strata::cuda
