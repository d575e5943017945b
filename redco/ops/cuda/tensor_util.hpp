#pragma once
// Tensor-level helpers shared by the CUDA backend's host files.
#include "redco/core/tensor.hpp"

namespace redco::cuda {

// Throws unless t is defined and lives on `dev`: mixing a CPU tensor into a
// CUDA op would otherwise hand a host pointer to a kernel.
void expect_on(const Tensor& t, Device dev, const char* op);
// t (checked as above) as f32, converted on the device when needed.
Tensor f32(const Tensor& t, Device dev, const char* op);
// Makes dev's CUDA device current for the scope.
class Scope {
 public:
  explicit Scope(Device dev);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int prev_;
};
// A fresh f32 tensor of `shape` on `dev`.
inline Tensor empty_on(const Shape& shape, Device dev, DType dt = DType::f32) {
  return Tensor::empty(shape, dt, dev);
}

}  // namespace redco::cuda
