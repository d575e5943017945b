#include "redco/ops/test_device/backend_test.hpp"

#include <utility>
#include <vector>

#include "redco/core/device_memory.hpp"
#include "redco/core/error.hpp"

namespace redco {
namespace {

// One op on the test device: host aliases of its operands for the CPU kernel,
// and its results moved back onto the device. A result that is (a view of) an
// operand's alias maps back to that operand's storage, so in-place kernels
// and ops returning their input behave as they do on the CPU.
class Call {
 public:
  Call(const char* op, Device device) : op_(op), device_(device) {}
  Call(const char* op, const Tensor& first) : Call(op, first.device()) {}

  Tensor in(const Tensor& t) {
    if (!t.defined()) return t;
    if (t.device() != device_) detail::mixed_devices(op_, device_, t);
    const TensorImpl& d = t.impl();
    auto st = std::make_shared<Storage>();
    st->data = d.storage->data;
    st->capacity = d.storage->capacity;
    st->device = Device::cpu();
    st->owned = false;
    st->keep_alive = d.storage;
    auto h = std::make_shared<TensorImpl>();
    h->storage = st;
    h->offset = d.offset;
    h->shape = d.shape;
    h->dtype = d.dtype;
    h->name = d.name;
    h->placement = d.placement;  // a split tensor stays unreadable to the kernel
    aliases_.emplace_back(st.get(), d.storage);
    return Tensor(std::move(h));
  }
  LayerNormSaved in(const LayerNormSaved& s) { return {in(s.mean), in(s.rstd)}; }
  AttentionExtras in(const AttentionExtras& x) {
    // The block table is host bookkeeping on every device.
    return {in(x.key_begin), in(x.key_end), in(x.causal_offset), in(x.bias), x.block_table};
  }

  Tensor out(const Tensor& h) {
    if (!h.defined()) return h;
    const TensorImpl& hi = h.impl();
    for (const auto& [alias, storage] : aliases_) {
      if (hi.storage.get() != alias) continue;
      auto d = std::make_shared<TensorImpl>();
      d->storage = storage;
      d->offset = hi.offset;
      d->shape = hi.shape;
      d->dtype = hi.dtype;
      d->placement = hi.placement;
      return Tensor(std::move(d));
    }
    REDCO_CHECK(h.device().is_cpu(), "{}: the CPU kernel returned a tensor on {}", op_,
                h.device().str());
    Tensor d = Tensor::empty(h.shape(), h.dtype(), device_);
    copy_bytes(d.device_ptr(), device_, h.device_ptr(), Device::cpu(), h.nbytes());
    return d;
  }
  TensorList out(const TensorList& hs) {
    TensorList ds;
    ds.reserve(hs.size());
    for (const Tensor& h : hs) ds.push_back(out(h));
    return ds;
  }
  void out(LayerNormSaved& dst, const LayerNormSaved& h) {
    dst.mean = out(h.mean);
    dst.rstd = out(h.rstd);
  }

 private:
  const char* op_;
  Device device_;
  std::vector<std::pair<const Storage*, std::shared_ptr<Storage>>> aliases_;
};

}  // namespace

Tensor TestBackend::unary(UnaryOp op, const Tensor& x) {
  Call c("unary", x);
  return c.out(cpu_.unary(op, c.in(x)));
}
Tensor TestBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Call c("binary", a);
  return c.out(cpu_.binary(op, c.in(a), c.in(b)));
}
Tensor TestBackend::binary_scalar(BinaryOp op, const Tensor& a, float s) {
  Call c("binary_scalar", a);
  return c.out(cpu_.binary_scalar(op, c.in(a), s));
}
void TestBackend::add_inplace(Tensor& a, const Tensor& b) {
  Call c("add_inplace", a);
  Tensor h = c.in(a);
  cpu_.add_inplace(h, c.in(b));
  a = c.out(h);
}
Tensor TestBackend::reduce(ReduceOp op, const Tensor& x, std::span<const int> axes) {
  Call c("reduce", x);
  return c.out(cpu_.reduce(op, c.in(x), axes));
}
Tensor TestBackend::argmax(const Tensor& x, int axis) {
  Call c("argmax", x);
  return c.out(cpu_.argmax(c.in(x), axis));
}
Tensor TestBackend::broadcast_to(const Tensor& x, const Shape& shape) {
  Call c("broadcast_to", x);
  return c.out(cpu_.broadcast_to(c.in(x), shape));
}
Tensor TestBackend::permute(const Tensor& x, std::span<const int> perm) {
  Call c("permute", x);
  return c.out(cpu_.permute(c.in(x), perm));
}
Tensor TestBackend::slice(const Tensor& x, int axis, int64_t start, int64_t len) {
  Call c("slice", x);
  return c.out(cpu_.slice(c.in(x), axis, start, len));
}
void TestBackend::slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start) {
  Call c("slice_assign", dst);
  Tensor h = c.in(dst);
  cpu_.slice_assign(h, c.in(src), axis, start);
  dst = c.out(h);
}
Tensor TestBackend::matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Call c("matmul", a);
  return c.out(cpu_.matmul(c.in(a), c.in(b), trans_a, trans_b));
}
void TestBackend::matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                              Tensor& out, bool accumulate) {
  Call c("matmul_into", a);
  Tensor h = c.in(out);
  cpu_.matmul_into(c.in(a), c.in(b), trans_a, trans_b, h, accumulate);
  out = c.out(h);
}
Tensor TestBackend::softmax(const Tensor& x) {
  Call c("softmax", x);
  return c.out(cpu_.softmax(c.in(x)));
}
Tensor TestBackend::softmax_backward(const Tensor& y, const Tensor& dy) {
  Call c("softmax_backward", y);
  return c.out(cpu_.softmax_backward(c.in(y), c.in(dy)));
}
Tensor TestBackend::log_softmax(const Tensor& x) {
  Call c("log_softmax", x);
  return c.out(cpu_.log_softmax(c.in(x)));
}
Tensor TestBackend::log_softmax_backward(const Tensor& y, const Tensor& dy) {
  Call c("log_softmax_backward", y);
  return c.out(cpu_.log_softmax_backward(c.in(y), c.in(dy)));
}
Tensor TestBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                               LayerNormSaved& saved) {
  Call c("layer_norm", x);
  LayerNormSaved h;
  Tensor y = cpu_.layer_norm(c.in(x), c.in(gamma), c.in(beta), eps, h);
  c.out(saved, h);
  return c.out(y);
}
TensorList TestBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            bool has_beta, const LayerNormSaved& saved) {
  Call c("layer_norm_backward", dy);
  return c.out(cpu_.layer_norm_backward(c.in(dy), c.in(x), c.in(gamma), has_beta, c.in(saved)));
}
Tensor TestBackend::rms_norm(const Tensor& x, const Tensor& gamma, float eps,
                             LayerNormSaved& saved) {
  Call c("rms_norm", x);
  LayerNormSaved h;
  Tensor y = cpu_.rms_norm(c.in(x), c.in(gamma), eps, h);
  c.out(saved, h);
  return c.out(y);
}
TensorList TestBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const LayerNormSaved& saved) {
  Call c("rms_norm_backward", dy);
  return c.out(cpu_.rms_norm_backward(c.in(dy), c.in(x), c.in(gamma), c.in(saved)));
}
Tensor TestBackend::gelu(const Tensor& x, bool tanh_approx) {
  Call c("gelu", x);
  return c.out(cpu_.gelu(c.in(x), tanh_approx));
}
Tensor TestBackend::gelu_backward(const Tensor& x, const Tensor& dy, bool tanh_approx) {
  Call c("gelu_backward", x);
  return c.out(cpu_.gelu_backward(c.in(x), c.in(dy), tanh_approx));
}
Tensor TestBackend::silu(const Tensor& x) {
  Call c("silu", x);
  return c.out(cpu_.silu(c.in(x)));
}
Tensor TestBackend::silu_backward(const Tensor& x, const Tensor& dy) {
  Call c("silu_backward", x);
  return c.out(cpu_.silu_backward(c.in(x), c.in(dy)));
}
Tensor TestBackend::cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                  Tensor& lse) {
  Call c("cross_entropy", logits);
  Tensor h_lse;
  Tensor y = cpu_.cross_entropy(c.in(logits), c.in(labels), ignore_index, h_lse);
  lse = c.out(h_lse);
  return c.out(y);
}
Tensor TestBackend::cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                           const Tensor& lse, const Tensor& dloss,
                                           int64_t ignore_index, bool overwrite_logits) {
  Call c("cross_entropy_backward", logits);
  return c.out(cpu_.cross_entropy_backward(c.in(logits), c.in(labels), c.in(lse), c.in(dloss),
                                           ignore_index, overwrite_logits));
}
Tensor TestBackend::embedding(const Tensor& table, const Tensor& ids) {
  Call c("embedding", table);
  return c.out(cpu_.embedding(c.in(table), c.in(ids)));
}
Tensor TestBackend::embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab,
                                       const Tensor& into) {
  Call c("embedding_backward", dout);
  return c.out(cpu_.embedding_backward(c.in(dout), c.in(ids), vocab, c.in(into)));
}
Tensor TestBackend::rotary(const Tensor& x, int64_t pos_offset, float base, bool inverse) {
  Call c("rotary", x);
  return c.out(cpu_.rotary(c.in(x), pos_offset, base, inverse));
}
Tensor TestBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              float scale, Tensor& lse, const AttentionExtras& extras) {
  Call c("attention", q);
  Tensor h_lse;
  Tensor o = cpu_.attention(c.in(q), c.in(k), c.in(v), causal, scale, h_lse, c.in(extras));
  lse = c.out(h_lse);
  return c.out(o);
}
TensorList TestBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& o, const Tensor& lse, const Tensor& dout,
                                           bool causal, float scale,
                                           const AttentionExtras& extras) {
  Call c("attention_backward", q);
  return c.out(cpu_.attention_backward(c.in(q), c.in(k), c.in(v), c.in(o), c.in(lse), c.in(dout),
                                       causal, scale, c.in(extras)));
}
Tensor TestBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                           int64_t pad) {
  Call c("conv2d", x);
  return c.out(cpu_.conv2d(c.in(x), c.in(w), c.in(bias), stride, pad));
}
TensorList TestBackend::conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                        bool has_bias, int64_t stride, int64_t pad) {
  Call c("conv2d_backward", dy);
  return c.out(cpu_.conv2d_backward(c.in(dy), c.in(x), c.in(w), has_bias, stride, pad));
}
Tensor TestBackend::max_pool2d(const Tensor& x, int64_t k, int64_t stride, Tensor& argmax) {
  Call c("max_pool2d", x);
  Tensor h_arg;
  Tensor y = cpu_.max_pool2d(c.in(x), k, stride, h_arg);
  argmax = c.out(h_arg);
  return c.out(y);
}
Tensor TestBackend::max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x,
                                        int64_t k, int64_t stride) {
  Call c("max_pool2d_backward", dy);
  return c.out(cpu_.max_pool2d_backward(c.in(dy), c.in(argmax), x, k, stride));
}
Tensor TestBackend::max_pool2d_gather(const Tensor& dx, const Tensor& argmax) {
  Call c("max_pool2d_gather", dx);
  return c.out(cpu_.max_pool2d_gather(c.in(dx), c.in(argmax)));
}
Tensor TestBackend::avg_pool2d(const Tensor& x, int64_t k, int64_t stride) {
  Call c("avg_pool2d", x);
  return c.out(cpu_.avg_pool2d(c.in(x), k, stride));
}
Tensor TestBackend::avg_pool2d_backward(const Tensor& dy, const Shape& x, int64_t k,
                                        int64_t stride) {
  Call c("avg_pool2d_backward", dy);
  return c.out(cpu_.avg_pool2d_backward(c.in(dy), x, k, stride));
}
Tensor TestBackend::group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               int64_t groups, float eps, LayerNormSaved& saved) {
  Call c("group_norm", x);
  LayerNormSaved h;
  Tensor y = cpu_.group_norm(c.in(x), c.in(gamma), c.in(beta), groups, eps, h);
  c.out(saved, h);
  return c.out(y);
}
TensorList TestBackend::group_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            int64_t groups, bool has_beta,
                                            const LayerNormSaved& saved) {
  Call c("group_norm_backward", dy);
  return c.out(
      cpu_.group_norm_backward(c.in(dy), c.in(x), c.in(gamma), groups, has_beta, c.in(saved)));
}
Tensor TestBackend::upsample_nearest2d(const Tensor& x, int64_t f) {
  Call c("upsample_nearest2d", x);
  return c.out(cpu_.upsample_nearest2d(c.in(x), f));
}
Tensor TestBackend::upsample_nearest2d_backward(const Tensor& dy, int64_t f) {
  Call c("upsample_nearest2d_backward", dy);
  return c.out(cpu_.upsample_nearest2d_backward(c.in(dy), f));
}
Tensor TestBackend::dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) {
  Call c("dropout_mask", Device::test());
  return c.out(cpu_.dropout_mask(shape, p, seed, stream));
}

void TestBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& co) {
  Call c("sgd_update", param);
  Tensor p = c.in(param), b = c.in(buf);
  cpu_.sgd_update(p, c.in(grad), b, co);
}
void TestBackend::adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamCoeffs& co) {
  Call c("adam_update", param);
  Tensor p = c.in(param), hm = c.in(m), hv = c.in(v);
  cpu_.adam_update(p, c.in(grad), hm, hv, co);
}
double TestBackend::sum_of_squares(const Tensor& x) {
  Call c("sum_of_squares", x);
  return cpu_.sum_of_squares(c.in(x));  // a host scalar, as a device would return it
}

}  // namespace redco
