// SdpaEvaluator (sdpa_evaluator.hpp).
#include "cudnn_standin/sdpa_evaluator.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "strata/types.hpp"

namespace strata::cudnn_standin {

using cuda::SdpaOp;
using cuda::SdpaOpKind;
using cuda::SdpaPointwise;
using cuda::SdpaTensor;
using cuda::SdpaType;

namespace {

template <class F>
void each(const SdpaTensor& t, F f) {
  std::array<std::int64_t, 4> i{};
  for (i[0] = 0; i[0] < t.dims[0]; ++i[0])
    for (i[1] = 0; i[1] < t.dims[1]; ++i[1])
      for (i[2] = 0; i[2] < t.dims[2]; ++i[2])
        for (i[3] = 0; i[3] < t.dims[3]; ++i[3]) f(i);
}

}  // namespace

SdpaEvaluator::SdpaEvaluator(const cuda::SdpaGraph& graph, std::map<std::int64_t, void*> bound,
                             std::map<std::int64_t, float> scalars)
    : g_(graph), place_(g_.tensors.size()), scalars_(std::move(scalars)) {
  for (std::size_t i = 0; i < g_.tensors.size(); ++i) {
    const SdpaTensor& t = g_.tensors[i];
    if (t.by_value) {
      const auto it = scalars_.find(t.uid);
      if (it == scalars_.end())
        throw std::invalid_argument("by-value tensor " + std::to_string(t.uid) + " not given");
      place_[i] = {&it->second, true};
    } else if (!t.is_virtual) {
      const auto it = bound.find(t.uid);
      if (it == bound.end() || !it->second)
        throw std::invalid_argument("tensor " + std::to_string(t.uid) + " not bound");
      if (t.type != SdpaType::bf16 && t.type != SdpaType::f32)
        throw std::invalid_argument("bound tensor " + std::to_string(t.uid) + " not bf16 or fp32");
      place_[i] = {it->second, false};
    }
  }
}

void SdpaEvaluator::run() {
  for (const SdpaOp& op : g_.ops) {
    if (op.kind == SdpaOpKind::reshape) {
      place_[op.y] = place_.at(op.x);
      continue;
    }
    if (!place_[op.y].data) {  // a virtual tensor: fp32 storage spanning its strides
      const SdpaTensor& t = g_.tensors[op.y];
      std::int64_t n = 1;
      for (int d = 0; d < 4; ++d) n += (t.dims[d] - 1) * t.strides[d];
      owned_.emplace_back(std::size_t(n), 0.0f);
      place_[op.y] = {owned_.back().data(), true};
    }
    if (op.kind == SdpaOpKind::matmul)
      matmul(op);
    else if (op.kind == SdpaOpKind::pointwise)
      pointwise(op);
    else
      reduce(op);
  }
}

// The element offset of `at` in tensor i, its size-1 dims broadcast.
std::int64_t SdpaEvaluator::offset(int i, const Index& at) const {
  const SdpaTensor& t = g_.tensors[i];
  std::int64_t off = 0;
  for (int d = 0; d < 4; ++d) off += (t.dims[d] == 1 ? 0 : at[d]) * t.strides[d];
  return off;
}

float SdpaEvaluator::read(int i, const Index& at) const {
  const Place& p = place_[i];
  if (p.is_float_buffer || g_.tensors[i].type == SdpaType::f32)
    return static_cast<const float*>(p.data)[offset(i, at)];
  return to_float(static_cast<const bf16*>(p.data)[offset(i, at)]);
}

void SdpaEvaluator::write(int i, const Index& at, float value) {
  const Place& p = place_[i];
  const bool bf16_tensor = g_.tensors[i].type == SdpaType::bf16;
  if (p.is_float_buffer)  // virtual: fp32 storage, rounded as the tensor's type says
    static_cast<float*>(p.data)[offset(i, at)] = bf16_tensor ? to_float(to_bf16(value)) : value;
  else if (bf16_tensor)
    static_cast<bf16*>(p.data)[offset(i, at)] = to_bf16(value);
  else
    static_cast<float*>(p.data)[offset(i, at)] = value;
}

void SdpaEvaluator::matmul(const SdpaOp& op) {
  const std::int64_t K = g_.tensors[op.x].dims[3];
  if (K != g_.tensors[op.b].dims[2]) throw std::invalid_argument("matmul: inner dims differ");
  const bool accumulates = g_.tensors[op.y].accumulates;
  each(g_.tensors[op.y], [&](const Index& i) {
    float acc = 0;
    for (std::int64_t k = 0; k < K; ++k)
      acc += read(op.x, {i[0], i[1], i[2], k}) * read(op.b, {i[0], i[1], k, i[3]});
    write(op.y, i, accumulates ? read(op.y, i) + acc : acc);
  });
}

void SdpaEvaluator::pointwise(const SdpaOp& op) {
  each(g_.tensors[op.y], [&](const Index& i) {
    const float x = read(op.x, i), b = op.b >= 0 ? read(op.b, i) : 0.0f;
    float y = 0;
    switch (op.mode) {
      case SdpaPointwise::add:
        y = x + b;
        break;
      case SdpaPointwise::sub:
        y = x - b;
        break;
      case SdpaPointwise::mul:
        y = x * b;
        break;
      case SdpaPointwise::div:
        y = x / b;
        break;
      case SdpaPointwise::exp:
        y = std::exp(x);
        break;
      case SdpaPointwise::log:
        y = std::log(x);
        break;
      case SdpaPointwise::identity:
        y = x;
        break;
      case SdpaPointwise::gen_index:
        y = float(i[op.axis]);
        break;
      case SdpaPointwise::cmp_ge:
        y = x >= b ? 1.0f : 0.0f;
        break;
      case SdpaPointwise::select:
        y = read(op.t, i) != 0 ? x : b;
        break;
    }
    write(op.y, i, y);
  });
}

void SdpaEvaluator::reduce(const SdpaOp& op) {
  const bool max = op.kind == SdpaOpKind::reduce_max;
  // Into an fp32 accumulator first: the output may be bf16 or a bound tensor.
  const SdpaTensor& y = g_.tensors[op.y];
  std::vector<float> acc(std::size_t(y.dims[0] * y.dims[1] * y.dims[2] * y.dims[3]),
                         max ? -INFINITY : 0.0f);
  auto slot = [&](const Index& i) -> float& {
    std::int64_t k = 0;
    for (int d = 0; d < 4; ++d) k = k * y.dims[d] + (y.dims[d] == 1 ? 0 : i[d]);
    return acc[std::size_t(k)];
  };
  each(g_.tensors[op.x], [&](const Index& i) {
    float& a = slot(i);
    a = max ? std::max(a, read(op.x, i)) : a + read(op.x, i);
  });
  each(y, [&](const Index& i) { write(op.y, i, slot(i)); });
}

}  // namespace strata::cudnn_standin
