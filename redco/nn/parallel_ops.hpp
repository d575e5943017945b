#pragma once
// Differentiable collectives over a model-parallel group (Megatron's f, g and
// gather): the pieces that turn a layer computed on parameter shards into the
// layer computed on whole parameters.
//
//   copy_to_parallel(x)      identity forward, all-reduce-sum backward: where
//                            a replicated activation enters column-parallel
//                            layers, each shard's gradient is a partial sum.
//   reduce_from_parallel(x)  all-reduce-sum forward, identity backward: where
//                            row-parallel layers leave partial sums.
//   gather_from_parallel(x, dim)  all-gather along `dim` forward, this rank's
//                            slice of the gradient backward.
//
// Each backward is written with the others, so a graph of the gradient
// (create_graph) gets its collectives too. The collectives block the calling
// thread in sched::sync_wait: the autograd engine runs backward on the thread
// that called it, and every rank (a thread of the threads backend, or a
// process) runs the same ops in the same order, which is the SPMD rule the
// communicator needs to pair calls.
#include "redco/autodiff/functional.hpp"
#include "redco/comm/comm.hpp"

namespace redco::nn {

Tensor copy_to_parallel(const Tensor& x, comm::Comm& comm);
Tensor reduce_from_parallel(const Tensor& x, comm::Comm& comm);
Tensor gather_from_parallel(const Tensor& x, comm::Comm& comm, int dim);

namespace detail {
// The in-place all-reduce on a private copy, so callers' tensors stay put.
inline Tensor all_reduce_copy(const Tensor& x, comm::Comm& comm) {
  Tensor out = x.detach().clone();
  sched::sync_wait(comm.all_reduce(out, comm::ReduceOp::sum));
  return out;
}
}  // namespace detail

inline Tensor copy_to_parallel(const Tensor& x, comm::Comm& comm) {
  if (comm.size() == 1) return x;
  comm::Comm* c = &comm;
  // A fresh tensor (not x itself) so the node has an output of its own.
  return record("copy_to_parallel", {x}, x.detach().clone(),
                [c](const Node&, const TensorList& g) -> TensorList {
                  return {reduce_from_parallel(g[0], *c)};
                });
}

inline Tensor reduce_from_parallel(const Tensor& x, comm::Comm& comm) {
  if (comm.size() == 1) return x;
  comm::Comm* c = &comm;
  Tensor out;
  {
    NoGradGuard no_grad;
    out = detail::all_reduce_copy(x, comm);
  }
  return record(
      "reduce_from_parallel", {x}, out,
      [c](const Node&, const TensorList& g) -> TensorList { return {copy_to_parallel(g[0], *c)}; });
}

namespace detail {
// x split along `dim` is gathered with the communicator's dim-0 all_gather:
// move `dim` to the front, gather, move it back.
inline Tensor all_gather_dim(const Tensor& x, comm::Comm& comm, int dim) {
  NoGradGuard no_grad;
  Tensor front = dim == 0 ? x.detach().clone() : transpose(x.detach(), 0, dim).clone();
  Shape gathered = front.shape();
  gathered[0] *= comm.size();
  Tensor out = Tensor::empty(gathered, x.dtype(), x.device());
  sched::sync_wait(comm.all_gather(front, out));
  return dim == 0 ? out : transpose(out, 0, dim).clone();
}
}  // namespace detail

inline Tensor gather_from_parallel(const Tensor& x, comm::Comm& comm, int dim) {
  if (dim < 0) dim += x.rank();
  REDCO_CHECK(dim >= 0 && dim < x.rank(), "gather_from_parallel: dim {} out of range for {}", dim,
              x.shape());
  if (comm.size() == 1) return x;
  const int64_t m = x.dim(dim);
  const int64_t begin = comm.rank() * m;
  return record("gather_from_parallel", {x}, detail::all_gather_dim(x, comm, dim),
                [dim, m, begin](const Node&, const TensorList& g) -> TensorList {
                  return {slice(g[0], dim, begin, begin + m)};
                });
}

}  // namespace redco::nn
