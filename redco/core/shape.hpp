#pragma once
// Shape: up to 8 dimensions stored inline (no allocation), row-major.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "redco/core/error.hpp"

namespace redco {

class Shape {
 public:
  static constexpr int kMaxRank = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(std::span(dims.begin(), dims.size())); }
  explicit Shape(std::span<const int64_t> dims) { assign(dims); }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[axis(i)]; }
  int64_t& operator[](int i) { return dims_[axis(i)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Normalises a possibly negative axis (-1 = last); throws if out of range.
  int axis(int i) const {
    const int a = i < 0 ? i + rank_ : i;
    REDCO_CHECK(a >= 0 && a < rank_, "axis {} is out of range for a tensor of rank {}", i, rank_);
    return a;
  }
  std::span<const int64_t> dims() const { return {dims_.data(), size_t(rank_)}; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  int64_t last() const { return rank_ ? dims_[rank_ - 1] : 1; }
  // Product of all dims but the last: the "rows" of a row-wise kernel.
  int64_t rows() const { return rank_ ? numel() / dims_[rank_ - 1] : 1; }
  Shape with(int i, int64_t v) const {
    Shape s = *this;
    s[i] = v;
    return s;
  }
  Shape drop(int i) const;               // without axis i
  Shape insert(int i, int64_t v) const;  // v inserted before axis i (i may equal rank)
  Shape append(int64_t v) const { return insert(rank_, v); }
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }
  std::string str() const;  // "[2, 3, 4]"

 private:
  void assign(std::span<const int64_t> dims);
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// The shape a and b broadcast to (numpy rules); throws naming both shapes and the op.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace redco

template <>
struct fmt::formatter<redco::Shape> : fmt::formatter<std::string> {
  auto format(const redco::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
