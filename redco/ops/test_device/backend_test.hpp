#pragma once
// The test device's backend (DeviceKind::test). Its memory is host memory
// from its own pool, so the CPU kernels can compute on it; but the only way
// they reach it is through this class, which hands them host aliases of the
// operands for the duration of one op and moves the results back onto the
// device. Everywhere else the bytes are off limits to the host (Tensor::raw
// refuses them), exactly as a GPU's are. CI runs the whole training and
// inference path on this device to prove that nothing falls back to the CPU
// silently; the CPU's own path pays nothing for it.
#include "redco/ops/cpu/backend_cpu.hpp"

namespace redco {

class TestBackend final : public Backend {
 public:
  Tensor unary(UnaryOp op, const Tensor& x) override;
  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) override;
  Tensor binary_scalar(BinaryOp op, const Tensor& a, float s) override;
  void add_inplace(Tensor& a, const Tensor& b) override;
  Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int> axes) override;
  Tensor argmax(const Tensor& x, int axis) override;
  Tensor broadcast_to(const Tensor& x, const Shape& shape) override;
  Tensor permute(const Tensor& x, std::span<const int> perm) override;
  Tensor slice(const Tensor& x, int axis, int64_t start, int64_t len) override;
  void slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start) override;
  Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) override;
  void matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& c,
                   bool accumulate) override;
  Tensor softmax(const Tensor& x) override;
  Tensor softmax_backward(const Tensor& y, const Tensor& dy) override;
  Tensor log_softmax(const Tensor& x) override;
  Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) override;
  Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                    LayerNormSaved& saved) override;
  TensorList layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 bool has_beta, const LayerNormSaved& saved) override;
  Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps, LayerNormSaved& saved) override;
  TensorList rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const LayerNormSaved& saved) override;
  Tensor gelu(const Tensor& x, bool tanh_approx) override;
  Tensor gelu_backward(const Tensor& x, const Tensor& dy, bool tanh_approx) override;
  Tensor silu(const Tensor& x) override;
  Tensor silu_backward(const Tensor& x, const Tensor& dy) override;
  Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                       Tensor& lse) override;
  Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                const Tensor& dloss, int64_t ignore_index,
                                bool overwrite_logits) override;
  Tensor embedding(const Tensor& table, const Tensor& ids) override;
  Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab,
                            const Tensor& into) override;
  Tensor rotary(const Tensor& x, int64_t pos_offset, float base, bool inverse) override;
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale,
                   Tensor& lse, const AttentionExtras& extras) override;
  TensorList attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                const Tensor& lse, const Tensor& dout, bool causal, float scale,
                                const AttentionExtras& extras) override;
  Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                int64_t pad) override;
  TensorList conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool has_bias,
                             int64_t stride, int64_t pad) override;
  Tensor max_pool2d(const Tensor& x, int64_t k, int64_t stride, Tensor& argmax) override;
  Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x, int64_t k,
                             int64_t stride) override;
  Tensor max_pool2d_gather(const Tensor& dx, const Tensor& argmax) override;
  Tensor avg_pool2d(const Tensor& x, int64_t k, int64_t stride) override;
  Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x, int64_t k, int64_t stride) override;
  Tensor group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups,
                    float eps, LayerNormSaved& saved) override;
  TensorList group_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 int64_t groups, bool has_beta,
                                 const LayerNormSaved& saved) override;
  Tensor upsample_nearest2d(const Tensor& x, int64_t f) override;
  Tensor upsample_nearest2d_backward(const Tensor& dy, int64_t f) override;
  Tensor dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) override;
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) override;
  void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                   const AdamCoeffs& c) override;
  double sum_of_squares(const Tensor& x) override;

 private:
  CpuBackend cpu_;
};

}  // namespace redco
