#include "redco/ops/test_device/backend_test.hpp"

#include <tuple>
#include <type_traits>
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

// One argument of an op as the CPU kernel takes it. Read-only tensors (and
// the structs holding them) become host aliases; a tensor the kernel writes
// (an output such as attention's lse, an in-place operand, a norm's saved
// state) is handed over as a host alias too, and put back after the kernel
// only where the kernel replaced it: an in-place update keeps the caller's
// tensor, name and gradient state included. Anything else passes as is.
template <typename T>
struct Arg {
  const T& x;
  Arg(Call&, const T& v) : x(v) {}
  const T& get() const { return x; }
  void finish(Call&) {}
};
template <>
struct Arg<const Tensor> {
  Tensor h;
  Arg(Call& c, const Tensor& t) : h(c.in(t)) {}
  const Tensor& get() const { return h; }
  void finish(Call&) {}
};
template <>
struct Arg<const LayerNormSaved> {
  LayerNormSaved h;
  Arg(Call& c, const LayerNormSaved& s) : h(c.in(s)) {}
  const LayerNormSaved& get() const { return h; }
  void finish(Call&) {}
};
template <>
struct Arg<const AttentionExtras> {
  AttentionExtras h;
  Arg(Call& c, const AttentionExtras& x) : h(c.in(x)) {}
  const AttentionExtras& get() const { return h; }
  void finish(Call&) {}
};
template <>
struct Arg<Tensor> {
  Tensor& dst;
  Tensor h;
  const TensorImpl* made;  // the alias handed to the kernel (null: none)
  Arg(Call& c, Tensor& t) : dst(t), h(c.in(t)), made(h.defined() ? &h.impl() : nullptr) {}
  Tensor& get() { return h; }
  void finish(Call& c) {
    if ((h.defined() ? &h.impl() : nullptr) != made) dst = c.out(h);
  }
};
template <>
struct Arg<LayerNormSaved> {
  LayerNormSaved& dst;
  LayerNormSaved h;
  Arg(Call&, LayerNormSaved& s) : dst(s) {}
  LayerNormSaved& get() { return h; }
  void finish(Call& c) { c.out(dst, h); }
};

// Runs one CPU kernel on host aliases of a test-device op's arguments and
// moves its results onto the device (a host scalar stays one, as a device
// would return it).
template <typename R, typename Method>
struct OnHost {
  const char* op;
  Method method;
  CpuBackend& cpu;
  template <typename... A>
  R operator()(A&... a) const {
    Call c(op, detail::DeviceOf{op}(a...));
    std::tuple<Arg<A>...> args{Arg<A>(c, a)...};
    auto kernel = [&](auto&... x) -> R { return (cpu.*method)(x.get()...); };
    if constexpr (std::is_void_v<R>) {
      std::apply(kernel, args);
      std::apply([&](auto&... x) { (x.finish(c), ...); }, args);
    } else {
      R r = std::apply(kernel, args);
      std::apply([&](auto&... x) { (x.finish(c), ...); }, args);
      if constexpr (std::is_arithmetic_v<R>)
        return r;
      else
        return c.out(r);
    }
  }
};
template <typename R, typename Method>
OnHost<R, Method> on_host(const char* op, Method m, CpuBackend& cpu) {
  return {op, m, cpu};
}

}  // namespace

// Every op of the list but dropout_mask, generated: the CPU kernel on host aliases.
#define REDCO_TEST_OP(ret, name, params, args)                                                  \
  ret TestBackend::name params {                                                                \
    return on_host<ret>(#name, static_cast<ret(CpuBackend::*) params>(&CpuBackend::name), cpu_) \
        args;                                                                                   \
  }
REDCO_DISPATCHED_OPS(REDCO_TEST_OP)
#undef REDCO_TEST_OP

// No tensor names the device: the mask is made on the test device.
Tensor TestBackend::dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) {
  Call c("dropout_mask", Device::test());
  return c.out(cpu_.dropout_mask(shape, p, seed, stream));
}

}  // namespace redco
