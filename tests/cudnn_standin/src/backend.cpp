// cuDNN's backend API over the CUDA emulator (see ../CMakeLists.txt). A descriptor keeps the
// attributes it is given; finalising checks the ones the descriptor needs, as cuDNN does; the
// heuristics offer one engine; an execution plan keeps its operation graph as sdpa_graph.hpp's
// plain data; an execution binds the variant pack's pointers and evaluates the graph
// (sdpa_evaluator.hpp) on the handle's stream, in order with the kernels around it.
//
// What it checks beyond the graph's arithmetic: every non-virtual tensor bound in the variant pack
// at its declared byte alignment, a workspace where the plan asks for one (written, so a bad
// pointer faults), and the dQ accumulator's contract (cuDNN adds into it: a caller that does not
// zero it gets a wrong dQ).
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/sdpa_cudnn_enums.hpp"
#include "backends/cuda/sdpa_graph.hpp"
#include "cudnn_standin/sdpa_evaluator.hpp"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace {

using strata::cuda::SdpaGraph;
using strata::cuda::SdpaOp;
using strata::cuda::SdpaOpKind;
using strata::cuda::SdpaPointwise;
using strata::cuda::SdpaTensor;
using strata::cuda::SdpaType;

// The plan's workspace: asked for so that the caller's binding of it is exercised.
constexpr std::int64_t kWorkspaceBytes = 256;

struct Attribute {
  cudnnBackendAttributeType_t type{};
  std::int64_t count = 0;
  std::vector<unsigned char> bytes;
};

struct Execution;

struct Descriptor {
  cudnnBackendDescriptorType_t type{};
  std::map<cudnnBackendAttributeName_t, Attribute> attributes;
  bool finalized = false;
  std::shared_ptr<const SdpaGraph> graph;          // an execution plan's
  std::map<std::int64_t, std::int64_t> alignment;  // its bound tensors' byte alignment, by uid
  std::vector<std::unique_ptr<Descriptor>> made;   // descriptors this one owns (a config's engine)
  // An execution plan's executions: a CUDA graph captured around one replays its host function
  // with its data, so they live as long as the plan.
  std::vector<std::unique_ptr<Execution>> executions;
};

struct Execution {
  std::shared_ptr<const SdpaGraph> graph;
  std::map<std::int64_t, void*> bound;
  std::map<std::int64_t, float> scalars;
  void* workspace = nullptr;
};

thread_local std::string last_error;

cudnnStatus_t fail(cudnnStatus_t status, const std::string& why) {
  last_error = why;
  return status;
}

std::size_t element_bytes(cudnnBackendAttributeType_t type) {
  switch (type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
      return sizeof(void*);
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
      return 8;
    case CUDNN_TYPE_BOOLEAN:
      return sizeof(bool);
    case CUDNN_TYPE_CHAR:
      return 1;
    default:  // enums, int32, float
      return 4;
  }
}

const Attribute* find(const Descriptor& d, cudnnBackendAttributeName_t name) {
  const auto it = d.attributes.find(name);
  return it == d.attributes.end() ? nullptr : &it->second;
}

template <class T>
std::vector<T> values(const Descriptor& d, cudnnBackendAttributeName_t name) {
  const Attribute* a = find(d, name);
  if (!a) return {};
  std::vector<T> v(std::size_t(a->count));
  std::memcpy(v.data(), a->bytes.data(), v.size() * sizeof(T));
  return v;
}

template <class T>
T value(const Descriptor& d, cudnnBackendAttributeName_t name, T fallback) {
  const Attribute* a = find(d, name);
  if (!a || a->count < 1) return fallback;
  T v;
  std::memcpy(&v, a->bytes.data(), sizeof(T));
  return v;
}

Descriptor* child(const Descriptor& d, cudnnBackendAttributeName_t name) {
  return static_cast<Descriptor*>(value<void*>(d, name, nullptr));
}

SdpaType sdpa_type(cudnnDataType_t t) {
  if (const auto s = strata::cuda::sdpa_name(strata::cuda::kSdpaCudnnTypes, t)) return *s;
  throw std::invalid_argument("a tensor data type the stand-in does not evaluate");
}

SdpaPointwise sdpa_mode(cudnnPointwiseMode_t m) {
  if (const auto s = strata::cuda::sdpa_name(strata::cuda::kSdpaCudnnPointwise, m)) return *s;
  throw std::invalid_argument("a pointwise mode the stand-in does not evaluate");
}

// The tensor descriptor as sdpa_graph.hpp's tensor (4-d only, as strata's graphs are).
SdpaTensor sdpa_tensor(const Descriptor& t) {
  SdpaTensor s;
  s.uid = value<std::int64_t>(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
  s.type = sdpa_type(value<cudnnDataType_t>(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT));
  const auto dims = values<std::int64_t>(t, CUDNN_ATTR_TENSOR_DIMENSIONS);
  const auto strides = values<std::int64_t>(t, CUDNN_ATTR_TENSOR_STRIDES);
  for (int i = 0; i < 4; ++i) s.dims[i] = dims.at(i), s.strides[i] = strides.at(i);
  s.is_virtual = value<bool>(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
  s.by_value = value<bool>(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, false);
  s.accumulates = value<cudnnBackendTensorReordering_t>(t, CUDNN_ATTR_TENSOR_REORDERING_MODE,
                                                        CUDNN_TENSOR_REORDERING_NONE) ==
                  CUDNN_TENSOR_REORDERING_F16x16;
  return s;
}

// The operation graph's operations and their tensors as sdpa_graph.hpp's data; each tensor's
// declared byte alignment into `alignment`.
SdpaGraph sdpa_graph(const Descriptor& graph, std::map<std::int64_t, std::int64_t>& alignment) {
  SdpaGraph g;
  std::map<const Descriptor*, int> index;
  auto tensor = [&](const Descriptor* t) {
    if (!t) return -1;
    const auto [it, added] = index.emplace(t, int(g.tensors.size()));
    if (added) {
      g.tensors.push_back(sdpa_tensor(*t));
      alignment[g.tensors.back().uid] =
          value<std::int64_t>(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1);
    }
    return it->second;
  };
  for (void* p : values<void*>(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    const Descriptor& op = *static_cast<const Descriptor*>(p);
    SdpaOp o;
    switch (op.type) {
      case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        o.kind = SdpaOpKind::matmul;
        o.x = tensor(child(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC));
        o.b = tensor(child(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
        o.y = tensor(child(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
        break;
      case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        const Descriptor& pw = *child(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
        o.kind = SdpaOpKind::pointwise;
        o.mode = sdpa_mode(
            value<cudnnPointwiseMode_t>(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_IDENTITY));
        o.axis = int(value<std::int64_t>(pw, CUDNN_ATTR_POINTWISE_AXIS, -1));
        o.x = tensor(child(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC));
        o.b = tensor(child(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC));
        o.t = tensor(child(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC));
        o.y = tensor(child(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
        break;
      }
      case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        const Descriptor& r = *child(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
        o.kind = value<cudnnReduceTensorOp_t>(r, CUDNN_ATTR_REDUCTION_OPERATOR,
                                              CUDNN_REDUCE_TENSOR_ADD) == CUDNN_REDUCE_TENSOR_MAX
                     ? SdpaOpKind::reduce_max
                     : SdpaOpKind::reduce_add;
        o.x = tensor(child(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
        o.y = tensor(child(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
        break;
      }
      case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        o.kind = SdpaOpKind::reshape;
        o.x = tensor(child(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC));
        o.y = tensor(child(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
        break;
      default:
        throw std::invalid_argument("an operation the stand-in does not evaluate");
    }
    g.ops.push_back(o);
  }
  return g;
}

// What cuDNN requires of a descriptor before it can be finalised (of the types strata uses).
std::string missing(const Descriptor& d) {
  auto needs = [&](std::initializer_list<cudnnBackendAttributeName_t> names) -> std::string {
    for (cudnnBackendAttributeName_t n : names)
      if (!find(d, n)) return "attribute " + std::to_string(int(n)) + " not set";
    return "";
  };
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      std::string m = needs({CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS,
                             CUDNN_ATTR_TENSOR_STRIDES, CUDNN_ATTR_TENSOR_UNIQUE_ID,
                             CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT});
      if (m.empty() && (values<std::int64_t>(d, CUDNN_ATTR_TENSOR_DIMENSIONS).size() != 4 ||
                        values<std::int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES).size() != 4))
        m = "a tensor that is not 4-d";
      return m;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      return needs({CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                    CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC});
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      return needs({CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                    CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC});
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      return needs({CUDNN_ATTR_OPERATIONGRAPH_OPS});
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return needs({CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_MODE});
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      return needs({CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG});
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
      std::string m =
          needs({CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS});
      if (m.empty() && find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->count !=
                           find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count)
        m = "a variant pack with as many pointers as unique ids";
      return m;
    }
    default:
      return "";
  }
}

void set_child(Descriptor& d, cudnnBackendAttributeName_t name, Descriptor* value) {
  Attribute a{CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, std::vector<unsigned char>(sizeof(void*))};
  std::memcpy(a.bytes.data(), &value, sizeof(void*));
  d.attributes[name] = std::move(a);
}

void run_execution(void* data) {
  const Execution& e = *static_cast<const Execution*>(data);
  if (e.workspace) std::memset(e.workspace, 0xA5, kWorkspaceBytes);
  strata::cudnn_standin::SdpaEvaluator(*e.graph, e.bound, e.scalars).run();
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    default:
      return "CUDNN_STATUS (stand-in: another)";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::strncpy(message, last_error.c_str(), max_size - 1);
  message[max_size - 1] = '\0';
  last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return fail(CUDNN_STATUS_NOT_INITIALIZED, "no CUDA device");
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "no handle");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t* descriptor) {
  auto* d = new Descriptor;
  d->type = type;
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  delete static_cast<Descriptor*>(descriptor);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements) {
  auto* d = static_cast<Descriptor*>(descriptor);
  if (!d || d->finalized) return fail(CUDNN_STATUS_BAD_PARAM, "set on a finalised descriptor");
  if (count < 0 || (count > 0 && !elements)) return fail(CUDNN_STATUS_BAD_PARAM, "no elements");
  Attribute a{type, count, std::vector<unsigned char>(std::size_t(count) * element_bytes(type))};
  if (count > 0) std::memcpy(a.bytes.data(), elements, a.bytes.size());
  d->attributes[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  auto* d = static_cast<Descriptor*>(descriptor);
  if (const std::string m = missing(*d); !m.empty()) return fail(CUDNN_STATUS_BAD_PARAM, m);
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {
    const Descriptor* config = child(*d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    const Descriptor* engine = config ? child(*config, CUDNN_ATTR_ENGINECFG_ENGINE) : nullptr;
    const Descriptor* graph = engine ? child(*engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH) : nullptr;
    if (!graph) return fail(CUDNN_STATUS_BAD_PARAM, "an engine configuration without a graph");
    try {
      d->graph = std::make_shared<const SdpaGraph>(sdpa_graph(*graph, d->alignment));
    } catch (const std::exception& e) {
      return fail(CUDNN_STATUS_NOT_SUPPORTED, e.what());
    }
  }
  d->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t* count, void* elements) {
  auto* d = static_cast<Descriptor*>(descriptor);
  if (!d || !d->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, "get from an unfinalised descriptor");
  std::int64_t answer = 0;
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {  // one engine for any graph
    if (requested >= 1 && elements) {
      auto* config = static_cast<Descriptor**>(elements)[0];
      auto engine = std::make_unique<Descriptor>();
      engine->type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
      set_child(*engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                child(*d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH));
      engine->finalized = true;
      set_child(*config, CUDNN_ATTR_ENGINECFG_ENGINE, engine.get());
      config->made.push_back(std::move(engine));
      config->finalized = true;
    }
    answer = 1;
  } else if (name == CUDNN_ATTR_ENGINECFG_ENGINE && requested >= 1 && elements) {
    auto* engine = static_cast<Descriptor**>(elements)[0];
    engine->attributes = child(*d, name)->attributes;
    engine->finalized = true;
    answer = 1;
  } else if (name == CUDNN_ATTR_ENGINE_GLOBAL_INDEX && requested >= 1 && elements) {
    *static_cast<std::int64_t*>(elements) = 0;
    answer = 1;
  } else if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE && requested >= 1 && elements) {
    *static_cast<std::int64_t*>(elements) = kWorkspaceBytes;
    answer = 1;
  } else {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "an attribute the stand-in does not answer");
  }
  (void)type;
  if (count) *count = answer;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_descriptor,
                                  cudnnBackendDescriptor_t pack_descriptor) {
  auto* plan = static_cast<Descriptor*>(plan_descriptor);
  const auto* pack = static_cast<const Descriptor*>(pack_descriptor);
  if (!handle || !plan || !plan->graph || !pack || !pack->finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, "execute needs a handle, a plan and a variant pack");
  auto e = std::make_unique<Execution>();
  e->graph = plan->graph;
  const auto uids = values<std::int64_t>(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const auto pointers = values<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  e->workspace = value<void*>(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
  if (!e->workspace) return fail(CUDNN_STATUS_BAD_PARAM, "no workspace for a plan that needs one");
  for (std::size_t i = 0; i < uids.size(); ++i) e->bound[uids[i]] = pointers[i];
  for (const SdpaTensor& t : plan->graph->tensors) {
    if (t.is_virtual) continue;
    const auto it = e->bound.find(t.uid);
    if (it == e->bound.end() || !it->second)
      return fail(CUDNN_STATUS_BAD_PARAM, "tensor " + std::to_string(t.uid) + " not in the pack");
    if (t.by_value) {
      e->scalars[t.uid] = *static_cast<const float*>(it->second);  // read now
    } else if (reinterpret_cast<std::uintptr_t>(it->second) % plan->alignment.at(t.uid) != 0) {
      return fail(CUDNN_STATUS_BAD_PARAM,
                  "tensor " + std::to_string(t.uid) + " not at its declared byte alignment");
    }
  }
  if (cudaLaunchHostFunc(handle->stream, run_execution, e.get()) != cudaSuccess)
    return fail(CUDNN_STATUS_EXECUTION_FAILED, "the stream refused the execution");
  plan->executions.push_back(std::move(e));
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
