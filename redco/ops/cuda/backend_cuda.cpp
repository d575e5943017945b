// CudaBackend, generic kernels: shape checks and output allocation on the
// host (the same checks and messages as the CPU backend), kernels in the .cu
// files. See ops/cpu/*.cpp for the semantics being mirrored.
#include "redco/ops/cuda/backend_cuda.hpp"

#include <fmt/ranges.h>

#include <array>
#include <vector>

#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/tensor_util.hpp"

namespace redco {

// The kernels take op codes as ints in the enums' order.
static_assert(int(UnaryOp::neg) == 0 && int(UnaryOp::erf) == 8 && int(UnaryOp::step) == 12);
static_assert(int(BinaryOp::add) == 0 && int(BinaryOp::pow) == 6 && int(BinaryOp::gt) == 8);

namespace cuda {

void expect_on(const Tensor& t, Device dev, const char* op) {
  REDCO_CHECK(t.defined(), "{}: an input tensor is undefined", op);
  REDCO_CHECK(t.device() == dev,
              "{}: a tensor on {} was mixed with tensors on {}; move it with "
              ".to(Device) first",
              op, t.device().str(), dev.str());
}

Tensor f32(const Tensor& t, Device dev, const char* op) {
  expect_on(t, dev, op);
  return t.dtype() == DType::f32 ? t : t.to(DType::f32);
}

Scope::Scope(Device dev) : prev_(current_device()) {
  if (prev_ != dev.index) set_device(dev.index);
}
Scope::~Scope() {
  if (current_device() != prev_) cudaSetDevice(prev_);
}

}  // namespace cuda

namespace {
using cuda::f32;
using cuda::Scope;

// Element strides of x viewed at the rank of `out`: 0 on broadcast axes.
void broadcast_strides(const Shape& x, const Shape& out, int64_t* st) {
  int64_t s = 1;
  for (int i = out.rank() - 1; i >= 0; --i) {
    const int ix = x.rank() - out.rank() + i;
    const int64_t d = ix >= 0 ? x[ix] : 1;
    st[i] = d == 1 ? 0 : s;
    s *= d;
  }
}

// Drops size-1 output axes and merges axes adjacent in the source too, so a
// permute or broadcast indexes as few dims as possible per element.
cuda::Strided simplify(const Shape& out, const int64_t* src) {
  cuda::Strided g;
  for (int i = 0; i < out.rank(); ++i) {
    if (out[i] == 1) continue;
    const int last = g.rank - 1;
    if (last >= 0 && g.a[last] == src[i] * out[i]) {
      g.dims[last] *= out[i];
      g.a[last] = src[i];
    } else {
      g.dims[g.rank] = out[i];
      g.a[g.rank++] = src[i];
    }
  }
  return g;
}

void contiguous_strides(const Shape& s, int64_t* st) {
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
}

// Copies `count` rows of `width` bytes between pitched buffers on the stream.
void copy_rows(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width,
               int64_t count) {
  if (width == 0 || count == 0) return;
  REDCO_CUDA(cudaMemcpy2DAsync(dst, size_t(dpitch), src, size_t(spitch), size_t(width),
                               size_t(count), cudaMemcpyDeviceToDevice, cuda::stream()));
}

void split_at(const Shape& s, int axis, size_t elem, int64_t* outer, int64_t* inner_bytes) {
  *outer = 1;
  for (int d = 0; d < axis; ++d) *outer *= s[d];
  int64_t inner = int64_t(elem);
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  *inner_bytes = inner;
}

}  // namespace

CudaBackend& CudaBackend::instance() {
  static CudaBackend b;
  return b;
}

Tensor CudaBackend::unary(UnaryOp op, const Tensor& x_in) {
  Scope scope(x_in.device());
  const Tensor x = f32(x_in, x_in.device(), "unary");
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  cuda::k::unary(int(op), x.device_data<float>(), y.device_data<float>(), x.numel());
  return y;
}

Tensor CudaBackend::binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = binary_name(op);
  const Device dev = a_in.device();
  Scope scope(dev);
  const Shape out = broadcast_shapes(a_in.shape(), b_in.shape(), name);
  const Tensor a = f32(a_in, dev, name), b = f32(b_in, dev, name);
  Tensor y = Tensor::empty(out, DType::f32, dev);
  cuda::Strided s;
  if (a.numel() != y.numel() || b.numel() != y.numel()) {
    s.rank = out.rank();
    for (int i = 0; i < out.rank(); ++i) s.dims[i] = out[i];
    broadcast_strides(a.shape(), out, s.a);
    broadcast_strides(b.shape(), out, s.b);
  }
  cuda::k::binary(int(op), a.device_data<float>(), b.device_data<float>(), y.device_data<float>(),
                  y.numel(), s);
  return y;
}

Tensor CudaBackend::binary_scalar(BinaryOp op, const Tensor& a_in, float s) {
  Scope scope(a_in.device());
  const Tensor a = f32(a_in, a_in.device(), "binary_scalar");
  Tensor y = Tensor::empty(a.shape(), DType::f32, a.device());
  cuda::k::binary_scalar(int(op), a.device_data<float>(), s, y.device_data<float>(), a.numel());
  return y;
}

void CudaBackend::add_inplace(Tensor& a, const Tensor& b_in) {
  Scope scope(a.device());
  check_same_shape(a, b_in, "add_inplace");
  if (a.dtype() != DType::f32) {  // accumulate in f32, round once into a's dtype
    a.copy_from(binary(BinaryOp::add, a, b_in));
    return;
  }
  const Tensor b = f32(b_in, a.device(), "add_inplace");
  cuda::k::add_inplace(a.device_data<float>(), b.device_data<float>(), a.numel());
}

Tensor CudaBackend::reduce(ReduceOp op, const Tensor& x_in, std::span<const int> axes) {
  Scope scope(x_in.device());
  Tensor cur = f32(x_in, x_in.device(), "reduce");
  if (axes.empty()) return cur.same(x_in) ? cur.clone() : cur;
  const meta::ReducePasses passes = meta::reduce_passes(x_in.shape(), axes);
  for (int i = 0; i < passes.count; ++i) {  // the CPU's passes, in its order
    const meta::ReducePass& p = passes.pass[size_t(i)];
    Tensor next = Tensor::empty(p.out, DType::f32, cur.device());
    cuda::k::reduce_pass(op == ReduceOp::max, cur.device_data<float>(), next.device_data<float>(),
                         p.outer, p.reduced, p.inner);
    cur = next;
  }
  return cur;
}

Tensor CudaBackend::argmax(const Tensor& x_in, int axis_in) {
  Scope scope(x_in.device());
  const int axis = x_in.shape().axis(axis_in);
  const Tensor x = f32(x_in, x_in.device(), "argmax");
  const Shape& xs = x.shape();
  Tensor y = Tensor::empty(xs.drop(axis), DType::i64, x.device());
  if (y.numel() == 0) return y;
  int64_t O = 1, I = 1;
  for (int d = 0; d < axis; ++d) O *= xs[d];
  for (int d = axis + 1; d < xs.rank(); ++d) I *= xs[d];
  cuda::k::argmax(x.device_data<float>(), y.device_data<int64_t>(), O, xs[axis], I);
  return y;
}

Tensor CudaBackend::broadcast_to(const Tensor& x, const Shape& shape) {
  Scope scope(x.device());
  const Shape& xs = x.shape();
  int64_t src[cuda::kMaxRank] = {};
  broadcast_strides(xs, shape, src);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  cuda::k::gather(x.device_ptr(), out.device_ptr(), int(dtype_size(x.dtype())),
                  simplify(shape, src), out.numel());
  return out;
}

Tensor CudaBackend::permute(const Tensor& x, std::span<const int> perm) {
  Scope scope(x.device());
  const Shape& xs = x.shape();
  int64_t xst[cuda::kMaxRank] = {}, src[cuda::kMaxRank] = {};
  contiguous_strides(xs, xst);
  Shape out_shape = xs;
  for (size_t i = 0; i < perm.size(); ++i) {
    out_shape[int(i)] = xs[perm[i]];
    src[i] = xst[perm[i]];
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  cuda::k::gather(x.device_ptr(), out.device_ptr(), int(dtype_size(x.dtype())),
                  simplify(out_shape, src), out.numel());
  return out;
}

Tensor CudaBackend::slice(const Tensor& x, int axis_in, int64_t start, int64_t len) {
  Scope scope(x.device());
  const int axis = x.shape().axis(axis_in);
  const int64_t n = x.dim(axis);
  Tensor out = Tensor::empty(x.shape().with(axis, len), x.dtype(), x.device());
  int64_t outer, inner;
  split_at(x.shape(), axis, dtype_size(x.dtype()), &outer, &inner);
  copy_rows(out.device_ptr(), len * inner, static_cast<const char*>(x.device_ptr()) + start * inner,
            n * inner, len * inner, outer);
  return out;
}

void CudaBackend::slice_assign(Tensor& dst, const Tensor& src_in, int axis_in, int64_t start) {
  Scope scope(dst.device());
  cuda::expect_on(src_in, dst.device(), "slice_assign");
  const int axis = dst.shape().axis(axis_in);
  const int64_t n = dst.dim(axis);
  const int64_t len = src_in.dim(axis);
  const Tensor src = src_in.dtype() == dst.dtype() ? src_in : src_in.to(dst.dtype());
  int64_t outer, inner;
  split_at(dst.shape(), axis, dtype_size(dst.dtype()), &outer, &inner);
  copy_rows(static_cast<char*>(dst.device_ptr()) + start * inner, n * inner, src.device_ptr(),
            len * inner, len * inner, outer);
}

}  // namespace redco
