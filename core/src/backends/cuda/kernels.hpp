// The CUDA backend of strata::Kernels (kernels.hpp): the model passes' compute on device memory,
// every call asynchronous on the context's stream except sum(), which returns its value to the
// host (and so waits for the stream). The layer passes are cuda/layers.cuh's; the bf16 GEMMs are
// cublasGemmEx (bf16 operands, fp32 accumulation) on the context's cuBLAS handle and workspace,
// a linear layer's forward cublasLtMatmul with the bias and GELU in its epilogue;
// the elementwise steps are own kernels (kernels.cu), bit for bit the CPU backend's arithmetic
// where it is elementwise, and deterministic (no atomics) in the scatter-adds of the embeddings.
// Plain C++ header: host-only sources include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "../kernels.hpp"  // strata::Kernels ("kernels.hpp" would be this file)
#include "backends/cuda/layers.cuh"
#include "backends/cuda/reduce.hpp"

namespace strata::cuda {

class CudnnAttention;

class CudaKernels final : public Kernels {
 public:
  // The context must outlive this object. `attention`: the kernels attention_forward/backward run
  // where they take the shape (kernels.hpp's AttentionKernel).
  explicit CudaKernels(const CudaContext& ctx,
                       AttentionKernel attention = AttentionKernel::reference);
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) override;
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int B, int T, int C) override;
  void layernorm_forward(ActView out, float* mean, float* rstd, ActView inp, const float* weight,
                         const float* bias, int N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, ActView inp,
                          const float* weight, const float* mean, const float* rstd, int N,
                          int C) override;
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override;
  void attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C,
                         int NH) override;
  void attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                          const float* att, ActView out, int B, int T, int C, int NH) override;
  void attention_block_forward(float* o, float* lse, ActView q, int q_stride, ActView kv, int B,
                               int Tq, int Tk, int NH, int KV, int hs, TokenPositions qpos,
                               TokenPositions kpos, bool first) override;
  void attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                                ActView out, const float* lse, ActView q, int q_stride, ActView kv,
                                int B, int Tq, int Tk, int NH, int KV, int hs, TokenPositions qpos,
                                TokenPositions kpos) override;
  void gelu_forward(ActView out, ActView inp, std::int64_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override;
  void residual_forward(ActView out, const float* a, ActView b, std::int64_t n) override;
  void residual_layernorm_forward(ActView sum, ActView out, float* mean, float* rstd,
                                  const float* a, ActView b, const float* weight, const float* bias,
                                  int N, int C) override;
  void rmsnorm_forward(ActView out, float* rstd, ActView inp, const float* weight, int N,
                       int C) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, ActView inp,
                        const float* weight, const float* rstd, int N, int C) override;
  void swiglu_forward(ActView out, ActView gu, int N, int F) override;
  void swiglu_backward(float* dgu, ActView gu, const float* dout, int N, int F) override;
  void rope_forward(ActView x, const float* table, int N, int T, int row0, int heads, int hs,
                    int row_stride) override;
  void rope_backward(float* dx, const float* table, int N, int T, int row0, int heads, int hs,
                     int row_stride) override;
  void repeat_kv_forward(ActView out, ActView in, int N, int NH, int KV, int hs) override;
  void repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs) override;
  void router_topk_forward(float* probs, std::int32_t* experts, float* gates, const float* logits,
                           int N, int E, int k) override;
  void router_topk_backward(float* dlogits, const float* probs, const std::int32_t* experts,
                            const float* gates, const float* dgates, const float* dprobs, int N,
                            int E, int k) override;
  void moe_aux_loss_forward(float* loss, float* scratch, const float* probs,
                            const std::int32_t* choices, int B, int T, int seq, int E, int k,
                            float coef) override;
  void moe_aux_loss_backward(float* dprobs, float* scratch, const std::int32_t* choices, int B,
                             int T, int seq, int E, int k, float coef_scale) override;
  void moe_gather(ActView out, ActView x, const std::int32_t* token_of, int rows, int C) override;
  void moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of, int N, int k,
                           int C) override;
  void moe_combine(float* y, const float* eout, const std::int32_t* row_of, const float* gates,
                   int N, int k, int C) override;
  void moe_combine_backward(float* deout, float* dgates, const float* dy, const float* eout,
                            const std::int32_t* row_of, const float* gates, int N, int k,
                            int C) override;
  void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                    const std::int32_t* targets, int N, int V) override;
  void crossentropy_softmax_backward(float* dlogits, const float* probs,
                                     const std::int32_t* targets, float grad_scale, int N,
                                     int V) override;

  void round_to_bf16(bf16* out, const float* in, std::size_t n) override;
  void widen_bf16(float* out, const bf16* in, std::size_t n) override;
  void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
                 void* C, DType c_dtype, bool accumulate, void* scratchpad,
                 std::size_t scratchpad_bytes) override;
  // 0: cuBLAS works in the context's workspace.
  std::size_t gemm_bf16_scratchpad_bytes(bool trans_a, bool trans_b, int M, int N, int K,
                                         DType c_dtype, bool accumulate) override;
  // One cublasLtMatmul with the bias in its epilogue (matmul_lt.cpp), D in the output's dtype,
  // then gelu_forward; the GEMM and bias as steps (matmul_bf16_forward_steps) where cuBLASLt has no
  // algorithm for them.
  void matmul_bf16_forward(ActView out, ActView gelu_out, const bf16* inp, const bf16* weight,
                           const float* bias, int N, int C, int OC, void* scratchpad,
                           std::size_t scratchpad_bytes, float* f32) override;
  // Whether cuBLASLt has a fused algorithm for a bf16 linear layer with an fp32 bias writing `out`
  // (fp32 or bf16) on this GPU (a plan is made and kept): what make test-gpu checks.
  bool fuses_bias(int N, int C, int OC, DType out);

  void zero(float* p, std::size_t n) override;
  void add_bias(float* out, const float* bias, std::size_t rows, int C) override;
  void bias_grad(float* dbias, const float* dout, std::size_t rows, int C) override;
  void round_to_bf16_bias_grad(bf16* out, float* dbias, const float* dout, std::size_t rows,
                               int C) override;
  void gelu_backward_bf16_bias_grad(bf16* out, float* dbias, float* scratch, ActView inp,
                                    const float* dout, std::size_t rows, int C) override;
  void add_into_bf16(bf16* dst, const float* src, std::size_t n) override;
  void embedding_rows(float* rows, const std::int32_t* tokens, std::size_t N, BufferView wte,
                      std::size_t v0, std::size_t Vl, int C) override;
  void add_positions(ActView out, const float* x, BufferView wpe, std::size_t rows,
                     std::size_t row0, int T, int C) override;
  void embedding_rows_backward(BufferView gwte, const float* d, const std::int32_t* tokens,
                               std::size_t N, std::size_t v0, std::size_t Vl, int C) override;
  void positions_backward(BufferView gwpe, const float* d, std::size_t rows, std::size_t row0,
                          int T, int C) override;
  void xent_row_max(float* mx, ActView logits, std::size_t N, std::size_t Vl) override;
  void xent_exp(ActView probs, float* sum, float* target, const float* mx,
                const std::int32_t* targets, std::size_t v0, std::size_t N,
                std::size_t Vl) override;
  void xent_normalise(float* probs, float* losses, const float* sum, const float* target,
                      std::size_t N, std::size_t Vl) override;
  void xent_backward_shard(float* dlogits, const float* probs, const std::int32_t* targets,
                           std::size_t v0, float scale, std::size_t N, std::size_t Vl) override;
  void softmax_crossentropy_grad_bf16(bf16* logits, float* losses, const std::int32_t* targets,
                                      std::size_t N, std::size_t V) override;
  void xent_normalise_grad_bf16(bf16* logits, float* losses, const float* mx, const float* sum,
                                const float* target, const std::int32_t* targets, std::size_t v0,
                                std::size_t N, std::size_t Vl) override;
  void scale_bf16(bf16* x, float scale, std::size_t n) override;
  double sum(const float* x, std::size_t n) override;

  // Device memory these kernels keep beside the arena: cuDNN's attention's (0 without it).
  std::size_t library_bytes() const;

 private:
  // cuDNN's attention (kernels.cu): made for --attention cudnn (refused by a build without it);
  // run where the run took it and it takes the shape, false where it did not run.
  void make_cudnn_attention();
  bool cudnn_attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C, int NH);
  bool cudnn_attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                                const float* att, ActView out, int B, int T, int C, int NH);
  // bias_grad, also writing the bf16 rounding of dout where dout_bf16 is not null, of
  // GELU'(gelu_inp) * dout instead of dout where gelu_inp is not null (fp32 or bf16;
  // kernels_steps.cu).
  void bias_grad_rounding(float* dbias, bf16* dout_bf16, const float* dout, std::size_t rows, int C,
                          ActView gelu_inp = {});
  // cublasLtMatmul with a cached plan (matmul_lt.cpp), D of d's dtype; false where cuBLASLt has
  // no algorithm (nothing queued).
  bool lt_matmul(cublasLtEpilogue_t epilogue, ActView d, const void* inp, const void* weight,
                 const float* bias, int N, int C, int OC);

  const CudaContext& ctx_;
  AttentionKernel attention_;
  DeviceSum sum_;
  // cuBLASLt's descriptors and algorithm per shape, epilogue and alignment (matmul_lt.cpp).
  struct LtPlans;
  struct LtPlansDeleter {
    void operator()(LtPlans* p) const;
  };
  std::unique_ptr<LtPlans, LtPlansDeleter> lt_plans_;
  // cuDNN's attention (cudnn_attention.hpp) where the run took it; a build without cuDNN has none.
  struct CudnnDeleter {
    void operator()(CudnnAttention* p) const;
  };
  std::unique_ptr<CudnnAttention, CudnnDeleter> cudnn_;
};

}  // namespace strata::cuda
