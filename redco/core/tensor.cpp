#include "redco/core/tensor.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/core/heartbeat.hpp"
#include "redco/core/philox.hpp"

namespace redco {
Storage::~Storage() {
  if (!owned || !data) return;
  if (device.is_cpu()) {
    CachingAllocator::cpu().deallocate(data, capacity);
  } else {
    device_memory(device).deallocate(device.index, data, capacity);
  }
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

void Shape::assign(std::span<const int64_t> dims) {
  REDCO_CHECK(dims.size() <= size_t(kMaxRank), "a tensor has at most {} dimensions, got {}",
              kMaxRank, dims.size());
  rank_ = int(dims.size());
  for (int i = 0; i < rank_; ++i) {
    // -1 is allowed only as the dim that Tensor::view infers; empty() rejects it.
    REDCO_CHECK(dims[i] >= -1, "negative dimension {} in a shape", dims[i]);
    dims_[i] = dims[i];
  }
}

Shape Shape::drop(int i) const {
  const int a = axis(i);
  Shape s;
  for (int j = 0; j < rank_; ++j)
    if (j != a) s.dims_[s.rank_++] = dims_[j];
  return s;
}

Shape Shape::insert(int i, int64_t v) const {
  REDCO_CHECK(i >= 0 && i <= rank_ && rank_ < kMaxRank, "cannot insert axis {} into {}", i, str());
  Shape s;
  for (int j = 0; j < i; ++j) s.dims_[s.rank_++] = dims_[j];
  s.dims_[s.rank_++] = v;
  for (int j = i; j < rank_; ++j) s.dims_[s.rank_++] = dims_[j];
  return s;
}

TensorImpl& Tensor::impl() const {
  REDCO_CHECK(impl_, "use of an undefined (default-constructed) Tensor");
  return *impl_;
}

void Tensor::refuse_host_read() const {
  const TensorImpl& i = impl();
  if (hidden_bytes(i) && !i.placement)
    fail(
        "tensor{} {} is {} ({}), not stored row by row; only the ops made for it and "
        "conversions read it: convert it first with .to(DType::bf16) (or f32)",
        name().empty() ? "" : " '" + name() + "'", shape(), i.encoding->describe(),
        i.encoding->maker());
  if (!i.placement) {
    fail(
        "tensor{} of shape {} lives on {}, and the host read its memory directly; device "
        "memory is read only through an explicit copy: t.to(Device::cpu()) (or copy_from into "
        "a CPU tensor). If this came from an op, one of its operands is on the wrong device",
        name().empty() ? "" : " '" + name() + "'", shape(), device().str());
  }
  const Placement& p = *i.placement;
  fail("a tensor of shape {} is {}: {}. {}", shape(), p.describe(),
       p.holds_values() ? "its data is one rank's part, and an op reading it as the whole tensor "
                          "would be wrong"
                        : "it has no values to read yet",
       p.read_hint());
}

void Tensor::check_dtype(DType t) const {
  REDCO_CHECK(dtype() == t, "tensor{} holds {} but was read as {}",
              name().empty() ? "" : " '" + name() + "'", dtype_name(dtype()), dtype_name(t));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    REDCO_CHECK(d >= 0, "cannot create a tensor of shape {}: -1 is only meaningful in view()",
                shape);
  heartbeat::progress();  // every op makes its outputs here: the rank is working
  auto st = std::make_shared<Storage>();
  st->device = device;
  const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  st->data = device.is_cpu() ? CachingAllocator::cpu().allocate(bytes, &st->capacity)
                             : device_memory(device).allocate(device.index, bytes, &st->capacity);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.raw(), 0, t.nbytes());
  } else {
    device_memory(device).fill(device.index, t.device_ptr(), dtype, t.numel(), 0.f);
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

template <typename T>
Tensor Tensor::from(std::span<const T> values, const Shape& shape) {
  REDCO_CHECK(int64_t(values.size()) == shape.numel(), "{} values cannot fill a tensor of shape {}",
              values.size(), shape);
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
template Tensor Tensor::from<float>(std::span<const float>, const Shape&);
template Tensor Tensor::from<int32_t>(std::span<const int32_t>, const Shape&);
template Tensor Tensor::from<int64_t>(std::span<const int64_t>, const Shape&);
template Tensor Tensor::from<uint8_t>(std::span<const uint8_t>, const Shape&);

Tensor Tensor::arange(int64_t n, DType dtype) {
  Tensor t = empty(Shape{n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i;
  return t.to(dtype);
}

Tensor Tensor::uniform(const Shape& shape, uint64_t seed, uint64_t stream, float lo, float hi) {
  Tensor t = empty(shape);
  philox_uniform(t.data<float>(), t.numel(), seed, stream, 0, lo, hi);
  return t;
}

Tensor Tensor::normal(const Shape& shape, uint64_t seed, uint64_t stream, float mean, float std) {
  Tensor t = empty(shape);
  philox_normal(t.data<float>(), t.numel(), seed, stream, 0, mean, std);
  return t;
}

Tensor Tensor::truncated_normal(const Shape& shape, uint64_t seed, uint64_t stream, float std,
                                float bound) {
  Tensor t = empty(shape);
  philox_truncated_normal(t.data<float>(), t.numel(), seed, stream, 0, 0.f, std, -bound, bound);
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  for (int64_t d : shape)
    REDCO_CHECK(d >= 0, "cannot borrow memory as shape {}: -1 is only meaningful in view()", shape);
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->capacity = size_t(shape.numel()) * dtype_size(dtype);
  st->owned = false;
  st->keep_alive = std::move(owner);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

namespace {
// Reads element i of any dtype as float.
float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      return float(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return float(static_cast<const int64_t*>(p)[i]);
    case DType::u8:
      return float(static_cast<const uint8_t*>(p)[i]);
    case DType::i8:
      return float(static_cast<const int8_t*>(p)[i]);
  }
  return 0;
}
void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = float_to_f16(v);
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = int64_t(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = uint8_t(int32_t(v));  // wraps, as on the GPU
      break;
    case DType::i8:
      static_cast<int8_t*>(p)[i] = int8_t(v);
      break;
  }
}
}  // namespace

float Tensor::item() const {
  REDCO_CHECK(numel() == 1, "item() needs a one-element tensor, got shape {}", shape());
  if (!on_host()) return to(Device::cpu()).item();
  return load(raw(), dtype(), 0);
}

std::vector<float> Tensor::to_vector() const {
  if (!on_host()) return to(Device::cpu()).to_vector();
  std::vector<float> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = load(raw(), dtype(), i);
  return out;
}

Tensor Tensor::view(const Shape& s) const {
  Shape target = s;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < target.rank(); ++i) {
    if (target[i] == -1)
      infer = i;
    else
      known *= target[i];
  }
  if (infer >= 0) {
    REDCO_CHECK(known > 0 && numel() % known == 0, "cannot view {} as {}", shape(), s);
    target[infer] = numel() / known;
  }
  REDCO_CHECK(target.numel() == numel(), "cannot view a tensor of shape {} ({} elements) as {}",
              shape(), numel(), s);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = target;
  impl->dtype = impl_->dtype;
  impl->placement = impl_->placement;  // a view of a split tensor is still split
  if (impl_->encoding) impl->encoding = impl_->encoding->view(*this, target);
  return Tensor(std::move(impl));
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  REDCO_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
              "slice [{}, {}) is out of range for dim 0 of shape {}", begin, end, shape());
  // The format says whether it can follow (it throws if not).
  std::shared_ptr<const Encoding> encoding =
      impl_->encoding ? impl_->encoding->rows(*this, begin, end) : nullptr;
  const int64_t row = dim(0) ? numel() / dim(0) : 0;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + size_t(begin * row) * dtype_size(dtype());
  impl->shape = shape().with(0, end - begin);
  impl->dtype = dtype();
  impl->placement = impl_->placement;
  impl->encoding = std::move(encoding);
  return Tensor(std::move(impl));
}

Tensor Tensor::operator[](int64_t i) const {
  Tensor row = slice0(i, i + 1);
  return row.view(shape().drop(0));
}

Tensor Tensor::clone() const {
  if (hidden_bytes(impl())) return impl_->encoding->clone(*this);
  Tensor t = empty(shape(), dtype(), device());
  copy_bytes(t.device_ptr(), device(), device_ptr(), device(), nbytes());
  if (impl_->encoding) t.impl().encoding = impl_->encoding->copy_to(*this, device());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  REDCO_CHECK(src.numel() == numel(), "copy_from: source shape {} does not match destination {}",
              src.shape(), shape());
  const Encoding* from = src.encoding();
  if (const Encoding* into = encoding())  // only the same format, copied whole, may land here
    REDCO_CHECK(from && from->row_major() && src.dtype() == dtype(),
                "copy_from: {} is {}; make one from the values with {} instead of copying {} "
                "into it",
                shape(), into->describe(), into->maker(), dtype_name(src.dtype()));
  if (const Encoding* e = from) {
    if (e->row_major() && src.dtype() == dtype()) {  // the encoded bytes and their encoding
      copy_bytes(device_ptr(), device(), src.device_ptr(), src.device(), nbytes());
      impl().encoding = e->copy_to(src, device());
      return;
    }
    // Its values, decoded.
    REDCO_CHECK(is_floating(dtype()) && on_host() && src.on_host(),
                "copy_from: {} converts to a floating CPU tensor, not to {} on {}", e->describe(),
                dtype_name(dtype()), device().str());
    if (dtype() == DType::f32 || dtype() == DType::bf16) return e->decode(src, dtype(), raw());
    Tensor wide = empty(shape());
    e->decode(src, DType::f32, wide.raw());
    return copy_from(wide);
  }
  if (src.dtype() == dtype()) {
    copy_bytes(device_ptr(), device(), src.device_ptr(), src.device(), nbytes());
    return;
  }
  if (!device().is_cpu() || !src.device().is_cpu()) {
    if (device() == src.device()) {  // convert where the data lives
      device_memory(device()).convert(device().index, device_ptr(), dtype(), src.device_ptr(),
                                      src.dtype(), numel());
    } else {  // move first (same dtype), then convert on the destination
      copy_from(src.to(device()));
    }
    return;
  }
  void* dst = raw();
  const void* s = src.raw();
  const DType sd = src.dtype(), dd = dtype();
  auto each = [&](auto&& convert) {  // convert(i) for every element, in parallel
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, numel(), 1 << 16), [&](auto r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) convert(i);
    });
  };
  // f32 <-> bf16 is what mixed precision does to GEMM operands: typed loops
  // the compiler vectorises, not the per-element dtype switch below.
  if (sd == DType::f32 && dd == DType::bf16) {
    const auto* from = static_cast<const uint32_t*>(s);  // [numel] f32 bits
    auto* to = static_cast<uint16_t*>(dst);              // [numel] bf16 bits
    return each([&](int64_t i) { to[i] = float_bits_to_bf16(from[i]); });
  }
  if (sd == DType::bf16 && dd == DType::f32) {
    const auto* from = static_cast<const uint16_t*>(s);  // [numel] bf16 bits
    auto* to = static_cast<uint32_t*>(dst);              // [numel] f32 bits
    return each([&](int64_t i) { to[i] = uint32_t(from[i]) << 16; });
  }
  each([&](int64_t i) { store(dst, dd, i, load(s, sd, i)); });
}

Tensor Tensor::to(DType t) const {
  if (t == dtype() && !hidden_bytes(impl())) return *this;
  Tensor out = empty(shape(), t, device());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  // The format says whether it can go there (it throws if not).
  std::shared_ptr<const Encoding> encoding =
      impl_->encoding ? impl_->encoding->copy_to(*this, d) : nullptr;
  Tensor out = empty(shape(), dtype(), d);
  copy_bytes(out.device_ptr(), d, device_ptr(), device(), nbytes());
  out.impl().encoding = std::move(encoding);
  return out;
}

void Tensor::fill(float value) {
  if (!device().is_cpu()) {
    device_memory(device()).fill(device().index, device_ptr(), dtype(), numel(), value);
    return;
  }
  if (dtype() == DType::f32) {
    std::fill_n(data<float>(), numel(), value);
    return;
  }
  for (int64_t i = 0; i < numel(); ++i) store(raw(), dtype(), i, value);
}

std::string Tensor::str(int max_elems) const {
  if (!defined()) return "Tensor(undefined)";
  if (placement())  // one rank's values would read as the whole tensor's
    return fmt::format("{}{} ({})", dtype_name(dtype()), shape().str(), placement()->describe());
  if (!device().is_cpu()) return to(Device::cpu()).str(max_elems) + " on " + device().str();
  if (hidden_bytes(impl()))
    return to(DType::bf16).str(max_elems) + " (" + impl_->encoding->describe() + ")";
  std::string s = fmt::format("{}{} {{", dtype_name(dtype()), shape().str());
  const int64_t n = std::min<int64_t>(numel(), max_elems);
  for (int64_t i = 0; i < n; ++i)
    s += fmt::format("{}{:.6g}", i ? ", " : "", load(raw(), dtype(), i));
  if (numel() > n) s += ", ...";
  return s + "}";
}

namespace {
AutogradMetaFactory g_autograd_meta_factory = nullptr;

// The tensor's autograd state, made through autodiff's factory when it has none.
AutogradMetaInterface& ensure_autograd(TensorImpl& i, const char* op) {
  if (!i.autograd) {
    REDCO_CHECK(g_autograd_meta_factory,
                "{}: redco's autograd is not linked into this program (link the whole redco "
                "library, or redco_autograd, and call its differentiable ops)",
                op);
    i.autograd = g_autograd_meta_factory();
  }
  return *i.autograd;
}
}  // namespace

void set_autograd_meta_factory(AutogradMetaFactory factory) { g_autograd_meta_factory = factory; }
AutogradMetaFactory autograd_meta_factory() { return g_autograd_meta_factory; }

Tensor& Tensor::set_requires_grad(bool r) {
  REDCO_CHECK(!r || is_floating(dtype()), "only floating-point tensors can require gradients ({})",
              dtype_name(dtype()));
  REDCO_CHECK(is_leaf() || r, "cannot clear requires_grad of a non-leaf tensor; use detach()");
  if (r || impl().autograd) ensure_autograd(impl(), "set_requires_grad").set_requires_grad(r);
  return *this;
}

Tensor Tensor::grad() const {
  const TensorImpl& i = impl();
  const Tensor* g = i.autograd ? i.autograd->grad() : nullptr;
  return g ? *g : Tensor();
}
void Tensor::set_grad(const Tensor& g) {
  if (g.defined() || impl().autograd) ensure_autograd(impl(), "set_grad").set_grad(g);
}
void Tensor::zero_grad() {
  if (impl().autograd) impl().autograd->set_grad(Tensor());
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  impl->placement = impl_->placement;  // still one rank's part
  impl->encoding = impl_->encoding;
  return Tensor(std::move(impl));
}

Tensor Tensor::encoded(const Tensor& bytes, const Shape& shape,
                       std::shared_ptr<const Encoding> encoding) {
  REDCO_CHECK(bytes.defined() && !bytes.encoding() && !bytes.placement() && encoding,
              "Tensor::encoded: needs plain whole bytes and an encoding");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = bytes.impl().storage;
  impl->offset = bytes.impl().offset;
  impl->shape = shape;
  impl->dtype = bytes.dtype();
  impl->name = bytes.name();
  impl->encoding = std::move(encoding);
  return Tensor(std::move(impl));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  REDCO_CHECK(a.shape() == b.shape(), "{}: shapes {} and {} do not match", op, a.shape(),
              b.shape());
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int r = std::max(a.rank(), b.rank());
  std::array<int64_t, Shape::kMaxRank> dims{};
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    REDCO_CHECK(da == db || da == 1 || db == 1,
                "{}: shapes {} and {} cannot be broadcast together (axis {}: {} vs {})", op, a, b,
                i - r, da, db);
    dims[size_t(i)] = da == 1 ? db : da;
  }
  return Shape(std::span<const int64_t>(dims.data(), size_t(r)));
}

}  // namespace redco
