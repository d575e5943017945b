#pragma once
// A tensor whose bytes encode its values rather than hold them plainly: a
// weight quantized to int8 by rows with a scale per row, a bf16 matrix packed
// in panels for the decode kernel. The ops that make and read such a format
// implement this interface beside their kernels (redco/ops/cpu/quantized_rows.hpp,
// redco/ops/cpu/decode_panels.hpp); core knows no format, only what its own
// operations (reads, views, slices, copies, conversions) must ask of one.
#include <memory>
#include <string>

#include "redco/core/device.hpp"
#include "redco/core/dtype.hpp"
#include "redco/core/shape.hpp"

namespace redco {

class Tensor;

struct Encoding {
  virtual ~Encoding() = default;
  // What the bytes are, for messages and str(): "a bf16 weight packed in decode panels".
  virtual std::string describe() const = 0;
  // The function that makes one (a refused copy into such a tensor names it).
  virtual std::string maker() const = 0;
  // True when the storage holds the dtype's values row by row (int8 rows:
  // plain reads see the int8 values); false when raw() must refuse.
  virtual bool row_major() const = 0;
  // The values of `t` (which carries this encoding), converted to `dtype`
  // (f32 or bf16), into a CPU buffer of t.numel() elements.
  virtual void decode(const Tensor& t, DType dtype, void* out) const = 0;
  // The encoding of `t` viewed as `shape`, of rows [begin, end) of its dim 0,
  // and of a deep copy of it on device `d`; each throws a message naming what
  // to do instead where the format cannot follow.
  virtual std::shared_ptr<const Encoding> view(const Tensor& t, const Shape& shape) const = 0;
  virtual std::shared_ptr<const Encoding> rows(const Tensor& t, int64_t begin,
                                               int64_t end) const = 0;
  virtual std::shared_ptr<const Encoding> copy_to(const Tensor& t, Device d) const = 0;
  // A copy of `t` with its own storage, for a format whose storage is not
  // row-major (clone() of a row-major one copies the bytes and copy_to()).
  virtual Tensor clone(const Tensor& t) const = 0;
};

}  // namespace redco
