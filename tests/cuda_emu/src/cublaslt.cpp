// The CUDA emulator's reference cuBLASLt (see cublasLt.h for what it checks and computes).
#include <cublasLt.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "internal.hpp"

struct cublasLtContext {};

struct cublasLtEmuMatrixLayout {
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
  std::int32_t order = CUBLASLT_ORDER_COL;
  std::int32_t batch = 1;
};

struct cublasLtEmuMatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  std::int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  std::int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  std::int32_t aux_type = -1, bias_type = -1;  // -1: D's type
};

struct cublasLtEmuMatmulPreference {
  std::uint32_t search_mode = 0;
  std::uint64_t max_workspace = 0;
  std::uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace strata_emu {
namespace {

constexpr std::uint64_t kAlgoTag = 0x5354524154414c54ull;  // "STRATALT": an emulator algorithm

// Copies an attribute's value from buf, whose size must be the attribute's, as cuBLASLt checks.
template <class T>
cublasStatus_t set_field(T& field, const void* buf, std::size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool has_bias(std::uint32_t e) { return e & CUBLASLT_EPILOGUE_BIAS; }
bool has_gelu(std::uint32_t e) { return e & CUBLASLT_EPILOGUE_GELU; }
bool has_aux(std::uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool emulated_epilogue(std::uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

// A matmul's shape, read off its descriptors by check().
struct Shape {
  int m, n, k;
};

cublasStatus_t not_supported(const char* call, const char* what) {
  report("%s: %s is not emulated (CUBLAS_STATUS_NOT_SUPPORTED)", call, what);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t check_layout(const cublasLtEmuMatrixLayout& l, const char* name, const char* call) {
  if (l.order != CUBLASLT_ORDER_COL) return not_supported(call, "an order other than COL");
  if (l.batch != 1) return not_supported(call, "a batched layout");
  if (l.rows > INT_MAX || l.cols > INT_MAX || l.ld > INT_MAX)
    return not_supported(call, "a dimension above INT_MAX");
  if (l.ld < std::int64_t(std::max<std::uint64_t>(1, l.rows))) {
    report("%s: layout %s: ld %lld < max(1, rows = %llu) (CUBLAS_STATUS_INVALID_VALUE)", call, name,
           static_cast<long long>(l.ld), static_cast<unsigned long long>(l.rows));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLASLt's checks of one configuration (heuristic and matmul alike); the shape on success.
cublasStatus_t check(const cublasLtEmuMatmulDesc& d, const cublasLtEmuMatrixLayout& a,
                     const cublasLtEmuMatrixLayout& b, const cublasLtEmuMatrixLayout& c,
                     const cublasLtEmuMatrixLayout& dl, Shape& s, const char* call) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F)
    return not_supported(call, "a compute or scale type other than CUBLAS_COMPUTE_32F / fp32");
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return not_supported(call, "a pointer mode other than host");
  const bool bf16_ab = a.type == CUDA_R_16BF && b.type == CUDA_R_16BF;
  const bool f32_ab = a.type == CUDA_R_32F && b.type == CUDA_R_32F;
  const bool bf16_cd = bf16_ab && c.type == CUDA_R_16BF && dl.type == CUDA_R_16BF;
  const bool f32_cd = c.type == CUDA_R_32F && dl.type == CUDA_R_32F;
  if (!(bf16_ab || f32_ab) || !(f32_cd || bf16_cd))
    return not_supported(call,
                         "a type combination other than bf16 (or fp32) A/B with fp32 C/D, or bf16 "
                         "A/B/C/D");
  if (!emulated_epilogue(d.epilogue)) return not_supported(call, "this epilogue");
  // The bias fp32 (with a bf16 D only when said so: its default is D's type); aux of D's type.
  if ((d.bias_type != -1 && d.bias_type != CUDA_R_32F) ||
      (bf16_cd && has_bias(d.epilogue) && d.bias_type != CUDA_R_32F))
    return not_supported(call, "a bias type other than fp32");
  if (d.aux_type != -1 && d.aux_type != dl.type)
    return not_supported(call, "an aux type other than D's");
  for (auto [l, name] : {std::pair{&a, "A"}, {&b, "B"}, {&c, "C"}, {&dl, "D"}})
    if (const cublasStatus_t st = check_layout(*l, name, call)) return st;
  auto invalid = [&](const char* why) {
    report("%s: %s (CUBLAS_STATUS_INVALID_VALUE)", call, why);
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  if ((d.transa != CUBLAS_OP_N && d.transa != CUBLAS_OP_T) ||
      (d.transb != CUBLAS_OP_N && d.transb != CUBLAS_OP_T))
    return invalid("TRANSA / TRANSB not CUBLAS_OP_N or CUBLAS_OP_T");
  s.m = int(dl.rows);
  s.n = int(dl.cols);
  s.k = int(d.transa == CUBLAS_OP_N ? a.cols : a.rows);
  const std::uint64_t rows_a = d.transa == CUBLAS_OP_N ? a.rows : a.cols;
  const std::uint64_t rows_b = d.transb == CUBLAS_OP_N ? b.rows : b.cols;
  const std::uint64_t cols_b = d.transb == CUBLAS_OP_N ? b.cols : b.rows;
  if (rows_a != dl.rows || rows_b != std::uint64_t(s.k) || cols_b != dl.cols)
    return invalid("op(A) [m x k] op(B) [k x n] does not fit D [m x n]");
  if (c.rows != dl.rows || c.cols != dl.cols) return invalid("C and D differ in shape");
  if (has_aux(d.epilogue) && d.aux_ld < std::int64_t(dl.rows))
    return invalid("EPILOGUE_AUX_LD below D's rows");
  return CUBLAS_STATUS_SUCCESS;
}

// The matmul's checks beyond the heuristic's: the heuristic sees no pointers (an H100 with cuBLAS
// 13.1 passes a BIAS epilogue without a bias pointer there and refuses it at the matmul).
cublasStatus_t check_pointers(const cublasLtEmuMatmulDesc& d, const char* call) {
  const char* why = nullptr;
  if (has_bias(d.epilogue) && d.bias == nullptr)
    why = "a BIAS epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER";
  else if (has_aux(d.epilogue) && d.aux == nullptr)
    why = "a GELU_AUX epilogue without an aux pointer";
  if (why == nullptr) return CUBLAS_STATUS_SUCCESS;
  report("%s: %s (CUBLAS_STATUS_INVALID_VALUE)", call, why);
  return CUBLAS_STATUS_INVALID_VALUE;
}

// The largest power of two (up to 256) that divides p's address.
std::uint32_t alignment_of(const void* p) {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && u % a) a /= 2;
  return a;
}

struct Matmul {
  cublasLtEmuMatmulDesc d;
  Shape s;
  float alpha, beta;
  const void *a, *b, *c;
  void* out;
  cudaDataType_t ab_type, d_type;
  std::int64_t lda, ldb, ldc, ldd;
};

// GELU as cuBLASLt documents it: the tanh approximation, in fp32.
float gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

void run_matmul(const Matmul& g) {
  const bool ta = g.d.transa == CUBLAS_OP_T, tb = g.d.transb == CUBLAS_OP_T;
  const std::vector<float> sums = gemm_sums(g.alpha, {g.a, g.ab_type, ta, g.lda},
                                            {g.b, g.ab_type, tb, g.ldb}, g.s.m, g.s.n, g.s.k);
  for (int j = 0; j < g.s.n; ++j)
    for (int i = 0; i < g.s.m; ++i) {
      float v = g.alpha * sums[i + std::size_t(j) * g.s.m];
      if (g.beta != 0.0f) v += g.beta * load(g.c, g.d_type, i + j * g.ldc);
      if (has_bias(g.d.epilogue)) v += static_cast<const float*>(g.d.bias)[i];
      if (has_aux(g.d.epilogue)) store(g.d.aux, g.d_type, i + j * g.d.aux_ld, v);
      if (has_gelu(g.d.epilogue)) v = gelu(v);
      store(g.out, g.d_type, i + j * g.ldd, v);
    }
}

// The algorithm a heuristic call returns: the tag, then the minimum alignments of A, B, C, D.
cublasStatus_t check_algo(const cublasLtMatmulAlgo_t* algo, const void* const (&ptrs)[4]) {
  const char* call = "cublasLtMatmul";
  if (algo == nullptr) return CUBLAS_STATUS_SUCCESS;
  if (algo->data[0] != kAlgoTag) {
    report("%s: the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned", call);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  static const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i)
    if (alignment_of(ptrs[i]) < algo->data[1 + i]) {
      report(
          "%s: %s at %p is %u-byte aligned, the algorithm was chosen for %llu "
          "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%s_BYTES)",
          call, names[i], ptrs[i], alignment_of(ptrs[i]),
          static_cast<unsigned long long>(algo->data[1 + i]), names[i]);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  return CUBLAS_STATUS_SUCCESS;
}

std::atomic<long long> g_heuristic_calls{0};

}  // namespace

long long lt_heuristic_calls() { return g_heuristic_calls.load(); }

}  // namespace strata_emu

using strata_emu::set_field;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  strata_emu::synchronize_all_streams();
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtEmuMatrixLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t bytes) {
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
      std::uint32_t t = 0;
      const cublasStatus_t st = set_field(t, buf, bytes);
      if (st == CUBLAS_STATUS_SUCCESS) l->type = cudaDataType_t(t);
      return st;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return set_field(l->order, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return set_field(l->rows, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return set_field(l->cols, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return set_field(l->ld, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return set_field(l->batch, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtEmuMatmulDesc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t bytes) {
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return set_field(d->compute, buf, bytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return set_field(d->scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return set_field(d->pointer_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_field(d->transa, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_field(d->transb, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_field(d->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return set_field(d->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return set_field(d->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return set_field(d->aux_ld, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return set_field(d->aux_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return set_field(d->bias_type, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtEmuMatmulPreference;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t bytes) {
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return set_field(p->search_mode, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_field(p->max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_field(p->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf,
                       bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  strata_emu::g_heuristic_calls.fetch_add(1);
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a || !b || !c || !d || !pref || requested <= 0 || !results || !returned)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  strata_emu::Shape s;
  if (const cublasStatus_t st =
          strata_emu::check(*desc, *a, *b, *c, *d, s, "cublasLtMatmulAlgoGetHeuristic"))
    return st;
  results[0] = {};
  results[0].algo.data[0] = strata_emu::kAlgoTag;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = pref->min_alignment[i];
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream) {
  using namespace strata_emu;
  const char* call = "cublasLtMatmul";
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a || !b || !c || !d || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Matmul g{*desc,
           {},
           *static_cast<const float*>(alpha),
           *static_cast<const float*>(beta),
           A,
           B,
           C,
           D,
           a->type,
           d->type,
           a->ld,
           b->ld,
           c->ld,
           d->ld};
  if (const cublasStatus_t st = check(*desc, *a, *b, *c, *d, g.s, call)) return st;
  if (const cublasStatus_t st = check_pointers(*desc, call)) return st;
  if (const cublasStatus_t st = check_algo(algo, {A, B, C, D})) return st;
  if (g.s.m == 0 || g.s.n == 0) return CUBLAS_STATUS_SUCCESS;
  const std::size_t elem = type_size(a->type);
  const bool reads_ab = g.alpha != 0.0f && g.s.k > 0;
  const bool ok =
      (!reads_ab ||
       (operand_inside(A, elem, int(a->rows), int(a->cols), int(a->ld), 0, 1, "A", call) &&
        operand_inside(B, elem, int(b->rows), int(b->cols), int(b->ld), 0, 1, "B", call))) &&
      (g.beta == 0.0f ||
       operand_inside(C, type_size(c->type), g.s.m, g.s.n, int(c->ld), 0, 1, "C", call)) &&
      operand_inside(D, type_size(d->type), g.s.m, g.s.n, int(d->ld), 0, 1, "D", call) &&
      (!has_bias(desc->epilogue) ||
       operand_inside(desc->bias, 4, g.s.m, 1, g.s.m, 0, 1, "bias", call)) &&
      (!has_aux(desc->epilogue) || operand_inside(desc->aux, type_size(d->type), g.s.m, g.s.n,
                                                  int(desc->aux_ld), 0, 1, "aux", call)) &&
      (workspace_bytes == 0 || in_device_memory(workspace, workspace_bytes));
  if (!ok) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (enqueue(stream, [g] { run_matmul(g); }) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
