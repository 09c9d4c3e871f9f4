// cuDNN's fused attention (cudnn_attention.hpp): sdpa_graph.hpp's graphs as backend descriptors,
// planned by cuDNN's heuristics (mode A) for the device, executed with variant packs. libcudnn is
// opened (dlopen) at the first use, not linked: a machine without cuDNN runs every other kernel.
// The CUDA emulator's build (STRATA_CUDNN_STANDIN) links tests/cudnn_standin's entry points
// instead, the rest unchanged.
#include "backends/cuda/cudnn_attention.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "backends/cuda/device.hpp"
#include "backends/cuda/layers.cuh"
#include "backends/cuda/sdpa_cudnn_enums.hpp"

namespace strata::cuda {

namespace {

using Desc = cudnnBackendDescriptor_t;

// The entry points used here, from libcudnn.so.9.
struct CudnnApi {
  decltype(&cudnnGetVersion) get_version;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error;
  decltype(&cudnnCreate) create;
  decltype(&cudnnDestroy) destroy;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnBackendCreateDescriptor) make;
  decltype(&cudnnBackendDestroyDescriptor) release;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
};

template <class F>
void resolve(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) throw Error(std::string("--attention cudnn: libcudnn.so.9 has no ") + name);
}

#if STRATA_CUDNN_STANDIN
#define STRATA_CUDNN_ENTRY(field, symbol) a.field = &symbol
#else
#define STRATA_CUDNN_ENTRY(field, symbol) resolve(lib, a.field, #symbol)
// The cuDNN a run gets (never closed: cuDNN's handles live until exit).
void* open_libcudnn() { return dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL); }
#endif

CudnnApi load_cudnn() {
#if !STRATA_CUDNN_STANDIN
  void* lib = open_libcudnn();
  if (!lib)
    throw Error(std::string("--attention cudnn: cannot open libcudnn.so.9: ") + dlerror(),
                "install cuDNN 9 (or add its lib directory to LD_LIBRARY_PATH), or run with "
                "--attention own");
#endif
  CudnnApi a{};
  STRATA_CUDNN_ENTRY(get_version, cudnnGetVersion);
  STRATA_CUDNN_ENTRY(error_string, cudnnGetErrorString);
  STRATA_CUDNN_ENTRY(last_error, cudnnGetLastErrorString);
  STRATA_CUDNN_ENTRY(create, cudnnCreate);
  STRATA_CUDNN_ENTRY(destroy, cudnnDestroy);
  STRATA_CUDNN_ENTRY(set_stream, cudnnSetStream);
  STRATA_CUDNN_ENTRY(make, cudnnBackendCreateDescriptor);
  STRATA_CUDNN_ENTRY(release, cudnnBackendDestroyDescriptor);
  STRATA_CUDNN_ENTRY(set_attribute, cudnnBackendSetAttribute);
  STRATA_CUDNN_ENTRY(get_attribute, cudnnBackendGetAttribute);
  STRATA_CUDNN_ENTRY(finalize, cudnnBackendFinalize);
  STRATA_CUDNN_ENTRY(execute, cudnnBackendExecute);
  if (a.get_version() < 91000)
    throw Error("--attention cudnn: libcudnn.so.9 is version " + std::to_string(a.get_version()) +
                    "; the graph API's device descriptions "
                    "and strata's attention graphs need 9.10 or newer",
                "run with --attention own");
  return a;
}

// Opened once per process (never closed: cuDNN's handles live until exit).
const CudnnApi& cudnn() {
  static const CudnnApi api = load_cudnn();
  return api;
}

[[noreturn]] void throw_cudnn_error(cudnnStatus_t st, const char* call, const char* file,
                                    int line) {
  char detail[1024] = {};
  cudnn().last_error(detail, sizeof detail);
  std::ostringstream os;
  os << file << ':' << line << ": cuDNN error " << cudnn().error_string(st) << " in " << call;
  if (detail[0]) os << ": " << detail;
  throw Error(os.str(),
              "rerun with CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr for cuDNN's own log, or "
              "with --attention own");
}

#define STRATA_CUDNN_CHECK(call)                                      \
  do {                                                                \
    const cudnnStatus_t strata_cudnn_st_ = (call);                    \
    if (strata_cudnn_st_ != CUDNN_STATUS_SUCCESS)                     \
      throw_cudnn_error(strata_cudnn_st_, #call, __FILE__, __LINE__); \
  } while (0)

// Every descriptor of one graph and its plan, destroyed together.
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnn().release(*it);
  }
  Desc make(cudnnBackendDescriptorType_t type) {
    Desc d = nullptr;
    STRATA_CUDNN_CHECK(cudnn().make(type, &d));
    owned_.push_back(d);
    return d;
  }

 private:
  std::vector<Desc> owned_;
};

template <class T>
void set(Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const T* values) {
  STRATA_CUDNN_CHECK(cudnn().set_attribute(d, name, type, count, values));
}
void set_desc(Desc d, cudnnBackendAttributeName_t name, Desc value) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
void set_type(Desc d, cudnnBackendAttributeName_t name, cudnnDataType_t type) {
  set(d, name, CUDNN_TYPE_DATA_TYPE, 1, &type);
}

Desc tensor_desc(Descriptors& d, const SdpaTensor& t) {
  Desc x = d.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set_type(x, CUDNN_ATTR_TENSOR_DATA_TYPE, cudnn_name(kSdpaCudnnTypes, t.type));
  set(x, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data());
  set(x, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data());
  set(x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
  const std::int64_t alignment = 16;
  set(x, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  const bool is_virtual = t.is_virtual;
  set(x, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (t.by_value) {
    const bool by_value = true;
    set(x, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  }
  if (t.accumulates) {
    const cudnnBackendTensorReordering_t reordering = CUDNN_TENSOR_REORDERING_F16x16;
    set(x, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reordering);
  }
  STRATA_CUDNN_CHECK(cudnn().finalize(x));
  return x;
}

// One operation of the graph, its inputs and output from `tensors`.
Desc operation_desc(Descriptors& d, const SdpaOp& op, const std::vector<Desc>& tensors) {
  Desc o = nullptr;
  if (op.kind == SdpaOpKind::matmul) {
    Desc m = d.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_type(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    STRATA_CUDNN_CHECK(cudnn().finalize(m));
    o = d.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensors[op.x]);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensors[op.b]);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensors[op.y]);
    set_desc(o, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
  } else if (op.kind == SdpaOpKind::pointwise) {
    Desc p = d.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnPointwiseMode_t mode = cudnn_name(kSdpaCudnnPointwise, op.mode);
    set(p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    // As cudnn-frontend computes them: the mask's indices in int32, its comparison in booleans.
    set_type(p, CUDNN_ATTR_POINTWISE_MATH_PREC,
             op.mode == SdpaPointwise::cmp_ge      ? CUDNN_DATA_BOOLEAN
             : op.mode == SdpaPointwise::gen_index ? CUDNN_DATA_INT32
                                                   : CUDNN_DATA_FLOAT);
    if (op.mode == SdpaPointwise::gen_index) {
      const std::int64_t axis = op.axis;
      set(p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    }
    STRATA_CUDNN_CHECK(cudnn().finalize(p));
    o = d.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p);
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensors[op.x]);
    if (op.b >= 0) set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensors[op.b]);
    if (op.t >= 0) set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensors[op.t]);
    set_desc(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensors[op.y]);
  } else if (op.kind == SdpaOpKind::reshape) {
    o = d.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensors[op.x]);
    set_desc(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensors[op.y]);
  } else {
    Desc r = d.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnReduceTensorOp_t reduce =
        op.kind == SdpaOpKind::reduce_max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    set_type(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    STRATA_CUDNN_CHECK(cudnn().finalize(r));
    o = d.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensors[op.x]);
    set_desc(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensors[op.y]);
  }
  STRATA_CUDNN_CHECK(cudnn().finalize(o));
  return o;
}

// The finalised operation graph of `g`.
Desc operation_graph(Descriptors& d, const SdpaGraph& g) {
  std::vector<Desc> tensors;
  for (const SdpaTensor& t : g.tensors) tensors.push_back(tensor_desc(d, t));
  std::vector<Desc> ops;
  for (const SdpaOp& op : g.ops) ops.push_back(operation_desc(d, op, tensors));
  Desc graph = d.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, std::int64_t(ops.size()),
      ops.data());
  STRATA_CUDNN_CHECK(cudnn().finalize(graph));
  return graph;
}

// The engine configurations cuDNN's heuristics (mode A) offer for `graph` on `device`, best
// first; only those that pass cuDNN's support checks are returned.
std::vector<Desc> engine_configs(Descriptors& d, Desc graph, Desc device) {
  Desc heuristics = d.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  set_desc(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  set_desc(heuristics, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device);
  STRATA_CUDNN_CHECK(cudnn().finalize(heuristics));
  std::int64_t count = 0;
  STRATA_CUDNN_CHECK(cudnn().get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Desc> configs(static_cast<std::size_t>(count));
  for (Desc& c : configs) c = d.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  STRATA_CUDNN_CHECK(cudnn().get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                           configs.data()));
  configs.resize(std::size_t(count));
  return configs;
}

std::int64_t engine_index(Descriptors& d, Desc config) {
  Desc engine = d.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t n = 0, index = -1;
  STRATA_CUDNN_CHECK(cudnn().get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
  STRATA_CUDNN_CHECK(cudnn().get_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64,
                                           1, &n, &index));
  return index;
}

// An execution plan of `config` for `device`; its finalise status is returned, not thrown.
std::pair<Desc, cudnnStatus_t> execution_plan(Descriptors& d, Desc config, Desc device) {
  Desc plan = d.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device);
  return {plan, cudnn().finalize(plan)};
}

// A planned graph: the first of the heuristics' configurations whose plan finalises.
struct Plan {
  Descriptors descriptors;
  Desc plan = nullptr;
  std::int64_t workspace_bytes = 0;
};

std::unique_ptr<Plan> make_plan(const SdpaGraph& g, cudnnHandle_t handle, int device_id,
                                const char* what) {
  auto p = std::make_unique<Plan>();
  Desc device = p->descriptors.make(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  set(device, CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &device_id);
  set(device, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  STRATA_CUDNN_CHECK(cudnn().finalize(device));
  Desc graph = operation_graph(p->descriptors, g);
  std::string statuses;
  for (Desc config : engine_configs(p->descriptors, graph, device)) {
    auto [plan, status] = execution_plan(p->descriptors, config, device);
    if (status == CUDNN_STATUS_SUCCESS) {
      std::int64_t n = 0;
      STRATA_CUDNN_CHECK(cudnn().get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &n, &p->workspace_bytes));
      p->plan = plan;
      return p;
    }
    statuses += std::string(statuses.empty() ? "" : ", ") + cudnn().error_string(status);
  }
  throw Error(std::string("cuDNN has no engine for the attention ") + what +
                  (statuses.empty() ? " (none offered)" : " (plans: " + statuses + ")"),
              "run with --attention own (strata's tensor-core kernel)");
}

}  // namespace

std::string cudnn_library_version() {
#if STRATA_CUDNN_STANDIN
  const std::size_t v = cudnnGetVersion();
  const std::string what = "stand-in of ";
#else
  // The library a run's --attention cudnn gets. Only cudnnGetVersion is needed, so an older
  // cuDNN still reports its number.
  void* lib = open_libcudnn();
  if (!lib) return "none";
  const auto get_version =
      reinterpret_cast<decltype(&cudnnGetVersion)>(dlsym(lib, "cudnnGetVersion"));
  const std::size_t v = get_version ? get_version() : 0;
  const std::string what;
#endif
  if (v == 0) return "unknown";
  // cuDNN 9 encodes 9.19.0 as 91900: 10000 * major + 100 * minor + patch.
  return what + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

SdpaPlanning plan_sdpa_for_device(const SdpaGraph& g, const std::string& device_json) {
  Descriptors d;
  Desc device = d.make(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  set(device, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
      std::int64_t(device_json.size() + 1), device_json.c_str());
  STRATA_CUDNN_CHECK(cudnn().finalize(device));
  Desc graph = operation_graph(d, g);
  SdpaPlanning planning;
  for (Desc config : engine_configs(d, graph, device)) {
    planning.engines.push_back(engine_index(d, config));
    planning.plan_status.push_back(cudnn().error_string(execution_plan(d, config, device).second));
  }
  return planning;
}

struct CudnnAttention::Impl {
  const CudaContext& ctx;
  cudnnHandle_t handle = nullptr;
  std::map<std::tuple<bool, int, int, int, int>, std::unique_ptr<Plan>> plans;
  // Device memory that only grows, at a shape's first call (see working_bytes()). A grown
  // buffer's old block is kept until the end: a CUDA graph captured before the growth (a
  // pipeline's second forward can come before its first backward) still names it.
  struct DeviceBuffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    std::vector<void*> blocks;
    std::size_t total = 0;  // of every block
    void* reserve(std::size_t n) {
      if (n > bytes) {
        void* grown = nullptr;
        STRATA_CUDA_CHECK(cudaMalloc(&grown, n));
        blocks.push_back(grown);
        data = grown, bytes = n, total += n;
      }
      return data;
    }
    ~DeviceBuffer() {
      for (void* b : blocks) cudaFree(b);
    }
  } workspace, dq_accum, staging;

  explicit Impl(const CudaContext& c) : ctx(c) {
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.device));
    STRATA_CUDNN_CHECK(cudnn().create(&handle));
  }
  ~Impl() {
    plans.clear();
    if (handle) cudnn().destroy(handle);
  }

  const Plan& plan(bool backward, const SdpaShape& s) {
    std::unique_ptr<Plan>& p = plans[{backward, s.B, s.T, s.NH, s.hs}];
    if (!p) {
      const std::string what = std::string(backward ? "backward" : "forward") +
                               " of B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                               " heads=" + std::to_string(s.NH) + " head size " +
                               std::to_string(s.hs);
      p = make_plan(backward ? sdpa_backward_graph(s) : sdpa_forward_graph(s), handle, ctx.device,
                    what.c_str());
      workspace.reserve(std::size_t(p->workspace_bytes));
      if (backward) dq_accum.reserve(std::size_t(s.B) * s.T * s.NH * s.hs * sizeof(float));
    }
    return *p;
  }

  // Runs `p` with the tensors of `bound` (uid, device pointer) and the scalars.
  void execute(const Plan& p, const SdpaShape& s, std::vector<std::int64_t> uids,
               std::vector<void*> pointers) {
    const float scale = 1.0f / std::sqrt(float(s.hs)), fill = sdpa_mask_fill(), one = 1.0f;
    for (auto [uid, value] : {std::pair{kSdpaScale, &scale}, std::pair{kSdpaMaskFill, &fill},
                              std::pair{kSdpaOne, &one}}) {
      uids.push_back(uid);
      pointers.push_back(const_cast<float*>(value));  // by value: read during execute
    }
    Descriptors d;
    Desc pack = d.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, std::int64_t(uids.size()),
        uids.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
        std::int64_t(pointers.size()), pointers.data());
    void* work = workspace.data;
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &work);
    STRATA_CUDNN_CHECK(cudnn().finalize(pack));
    STRATA_CUDNN_CHECK(cudnn().set_stream(handle, ctx.stream));
    STRATA_CUDNN_CHECK(cudnn().execute(handle, p.plan, pack));
  }
};

CudnnAttention::CudnnAttention(const CudaContext& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
CudnnAttention::~CudnnAttention() = default;

void CudnnAttention::forward(bf16* out, float* lse, const bf16* qkv, const SdpaShape& s) {
  const Plan& p = impl_->plan(false, s);
  const std::int64_t C = std::int64_t(s.NH) * s.hs;
  bf16* x = const_cast<bf16*>(qkv);  // cuDNN's variant pack takes void*; read only
  impl_->execute(p, s, {kSdpaQ, kSdpaK, kSdpaV, kSdpaO, kSdpaStats},
                 {x, x + C, x + 2 * C, out, lse});
}

void CudnnAttention::backward(bf16* dqkv, float* row_delta, const bf16* dout, const bf16* qkv,
                              const bf16* out, const float* lse, const SdpaShape& s) {
  const Plan& p = impl_->plan(true, s);
  const std::int64_t C = std::int64_t(s.NH) * s.hs;
  // The engine adds each key block's part of dQ into the accumulator: zero it first (as
  // cudnn-frontend's workspace does), in stream order so that a captured graph does it too.
  STRATA_CUDA_CHECK(cudaMemsetAsync(impl_->dq_accum.data, 0,
                                    std::size_t(s.B) * s.T * C * sizeof(float), impl_->ctx.stream));
  bf16* x = const_cast<bf16*>(qkv);  // read only, as the three below
  impl_->execute(
      p, s,
      {kSdpaQ, kSdpaK, kSdpaV, kSdpaO, kSdpaDO, kSdpaStats, kSdpaDQ, kSdpaDK, kSdpaDV,
       kSdpaRowDelta, kSdpaDQAccum},
      {x, x + C, x + 2 * C, const_cast<bf16*>(out), const_cast<bf16*>(dout),
       const_cast<float*>(lse), dqkv, dqkv + C, dqkv + 2 * C, row_delta, impl_->dq_accum.data});
}

bf16* CudnnAttention::staging(std::size_t elements) {
  return static_cast<bf16*>(impl_->staging.reserve(elements * sizeof(bf16)));
}

std::size_t CudnnAttention::working_bytes() const {
  return impl_->workspace.total + impl_->dq_accum.total + impl_->staging.total;
}

}  // namespace strata::cuda
