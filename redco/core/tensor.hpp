#pragma once
// Tensor: a dense, row-major n-d array with a dtype and a device, over
// refcounted storage. Copies of a Tensor share data (like a shared_ptr);
// `clone()` copies. Views (`view`, `slice0`, `operator[]`) share storage and
// are free. Every tensor is contiguous: transposes are explicit copies, which
// keeps every kernel simple and fast.
//
// Autograd hangs its state on a tensor through one opaque hook
// (core/autograd_hook.hpp); the graph and the differentiable functions are in
// redco/autodiff, which core does not include.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "redco/core/autograd_hook.hpp"
#include "redco/core/device.hpp"
#include "redco/core/dtype.hpp"
#include "redco/core/encoding.hpp"
#include "redco/core/shape.hpp"

namespace redco {

class Tensor;

// Where a tensor's values live across a model-parallel group. A tensor with
// no placement is whole on this rank. One with a placement (split by
// features, or a partial sum awaiting its reduction) holds only this rank's
// part, so reading its data as if it were whole would be silently wrong:
// raw() and data() refuse, with a message naming nn::whole(). Views and
// detach() keep the placement. An LM head's logits in training are a
// placement too: not formed at all until the loss reads them
// (nn/deferred_logits.cpp). Core knows no communicators and no losses:
// redco/nn/tensor_parallel.hpp implements this interface holding a
// communicator, and a placement a loss reads part by part also implements
// autodiff/loss_on_parts.hpp.
struct Placement {
  virtual ~Placement() = default;
  // E.g. "split along its last dim across 2 model-parallel ranks (this rank holds 8 of 16)".
  virtual std::string describe() const = 0;
  // The whole tensor (a collective over the group; differentiable).
  virtual Tensor whole(const Tensor& t) const = 0;
  // What to call instead of reading the data (the end of the error message).
  virtual std::string read_hint() const {
    return "Call nn::whole(t) to gather it, or nn::local(t) for this rank's part as a plain "
           "tensor";
  }
  // False when no values exist yet (an LM head's deferred logits: whole()
  // computes them).
  virtual bool holds_values() const { return true; }
};

// A block of device memory. Returned to its allocator's cache when the last
// tensor using it goes away.
struct Storage {
  void* data = nullptr;
  size_t capacity = 0;  // bytes, as rounded by the allocator
  Device device;
  bool owned = true;                 // false: borrowed memory (e.g. a mapped file), not freed here
  std::shared_ptr<void> keep_alive;  // for borrowed memory: whatever owns it
  ~Storage();
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes from storage->data
  Shape shape;
  DType dtype = DType::f32;
  // Null until the tensor requires a gradient; owned here, defined by redco/autodiff.
  std::unique_ptr<AutogradMetaInterface> autograd;
  std::string name;                            // optional, used in error messages
  std::shared_ptr<const Placement> placement;  // null: whole on this rank
  // Null: the storage holds the values plainly. Otherwise how its bytes
  // encode them (core/encoding.hpp: int8 rows with scales, decode panels);
  // views and copies carry it, conversions decode through it.
  std::shared_ptr<const Encoding> encoding;
};

class Tensor {
 public:
  Tensor() = default;

  // ---- construction -------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor ones(const Shape& shape) { return full(shape, 1.f); }
  static Tensor scalar(float value) { return full(Shape{}, value); }
  template <typename T>
  static Tensor from(std::span<const T> values, const Shape& shape);
  static Tensor from(std::initializer_list<float> values, const Shape& shape) {
    return from<float>(std::span(values.begin(), values.size()), shape);
  }
  static Tensor arange(int64_t n, DType dtype = DType::f32);
  // Random tensors: element i depends only on (seed, stream, i); see philox.hpp.
  static Tensor uniform(const Shape& shape, uint64_t seed, uint64_t stream, float lo, float hi);
  static Tensor normal(const Shape& shape, uint64_t seed, uint64_t stream, float mean, float std);
  static Tensor truncated_normal(const Shape& shape, uint64_t seed, uint64_t stream, float std,
                                 float bound = 2.f);
  // Wraps memory owned by someone else (kept alive by `owner`).
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);
  // A tensor whose bytes `bytes` encode its values (core/encoding.hpp); the
  // formats' own functions make these (quantize_rows, pack_panels).
  static Tensor encoded(const Tensor& bytes, const Shape& shape,
                        std::shared_ptr<const Encoding> encoding);
  // How the bytes encode the values; null for a plain tensor.
  const Encoding* encoding() const { return impl().encoding.get(); }

  // ---- metadata -----------------------------------------------------------
  bool defined() const { return bool(impl_); }
  const Shape& shape() const { return impl().shape; }
  int rank() const { return shape().rank(); }
  int64_t dim(int i) const { return shape()[i]; }
  int64_t numel() const { return shape().numel(); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  std::string str(int max_elems = 8) const;  // "f32[2, 3] {1, 2, ...}"
  const std::string& name() const { return impl().name; }
  Tensor& set_name(std::string n) {
    impl().name = std::move(n);
    return *this;
  }

  // ---- data access (checked dtype) ----------------------------------------
  template <typename T>
  T* data() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(raw());
  }
  // Host access: the values of a CPU tensor. A tensor on any other device is
  // refused (a host read of device memory would crash on a GPU, and an
  // implicit copy would hide a device-to-host sync): copy it explicitly with
  // to(Device::cpu()) first. Kernels use device_ptr() instead.
  void* raw() const {
    const TensorImpl& i = impl();
    if (i.placement || hidden_bytes(i) || !i.storage->device.is_cpu()) [[unlikely]]
      refuse_host_read();
    return static_cast<char*>(i.storage->data) + i.offset;
  }
  // The address of the values on their device, for a backend's kernels and
  // for copies: only the device's own code may dereference it.
  void* device_ptr() const {
    const TensorImpl& i = impl();
    if (i.placement || hidden_bytes(i)) [[unlikely]]
      refuse_host_read();
    return static_cast<char*>(i.storage->data) + i.offset;
  }
  template <typename T>
  T* device_data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(device_ptr());
  }
  // Copies of the values into host memory, from any device: these are the
  // explicit reads (like PyTorch's item() / tolist(), a device-to-host copy
  // when the tensor is on a device). A model-parallel shard is still refused.
  float item() const;                    // a one-element tensor's value as float
  std::vector<float> to_vector() const;  // any floating dtype, converted to float
  template <typename T>
  std::vector<T> values() const {
    if (!on_host()) [[unlikely]]
      return to(Device::cpu()).template values<T>();
    const T* p = data<T>();
    return std::vector<T>(p, p + numel());
  }
  // True when the values live in host memory (a CPU tensor, not a shard view).
  bool on_host() const { return impl().storage->device.is_cpu(); }

  // ---- views and copies (no autograd; see redco/autodiff for differentiable ones)
  Tensor view(const Shape& shape) const;  // same data, new shape (same numel; one dim may be -1)
  Tensor slice0(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0
  Tensor operator[](int64_t i) const;               // row i of dim 0, rank - 1
  Tensor clone() const;                             // deep copy, no autograd history
  Tensor to(DType dtype) const;                     // converted copy (or *this if same)
  Tensor to(Device device) const;                   // copy on `device` (or *this if there)
  void copy_from(const Tensor& src);                // same numel; converts dtype and device
  void fill(float value);
  bool shares_storage_with(const Tensor& other) const {
    return defined() && other.defined() && impl_->storage == other.impl_->storage;
  }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }
  // How the values are spread over a model-parallel group (null: whole here).
  const Placement* placement() const { return defined() ? impl_->placement.get() : nullptr; }

  // ---- autograd -------------------------------------------------------------
  // The graph (the node that produced a tensor) is autodiff's: redco/autodiff/node.hpp.
  bool requires_grad() const {
    return defined() && impl_->autograd && impl_->autograd->requires_grad();
  }
  Tensor& set_requires_grad(bool r = true);
  bool is_leaf() const { return !impl().autograd || impl().autograd->is_leaf(); }
  // The gradient accumulated into a leaf by backward(); undefined before.
  Tensor grad() const;
  void set_grad(const Tensor& g);
  void zero_grad();  // drops the gradient (the buffer returns to the cache)
  // Same data, no history, requires_grad = false.
  Tensor detach() const;
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  void check_dtype(DType t) const;
  [[noreturn]] void refuse_host_read() const;
  // An encoding whose storage is not the dtype's values row by row.
  static bool hidden_bytes(const TensorImpl& i) { return i.encoding && !i.encoding->row_major(); }
  std::shared_ptr<TensorImpl> impl_;
};

using TensorList = std::vector<Tensor>;

// Throws a message naming both shapes and the op when they differ.
void check_same_shape(const Tensor& a, const Tensor& b, const char* op);

}  // namespace redco
