#include "redco/comm/bytes.hpp"

#include <algorithm>
#include <cstring>

#include "redco/core/error.hpp"

namespace redco::comm {

std::vector<std::string> all_gather_bytes(const std::string& mine, Comm& c) {
  const int n = c.size();
  Tensor size = Tensor::empty(Shape{1}, DType::i64);  // [1] this rank's byte count
  size.data<int64_t>()[0] = int64_t(mine.size());
  Tensor sizes = Tensor::empty(Shape{n}, DType::i64);  // [n] every rank's
  sched::sync_wait(c.all_gather(size, sizes));
  int64_t longest = 1;  // at least one byte, so every buffer is non-empty
  for (int r = 0; r < n; ++r) longest = std::max(longest, sizes.data<int64_t>()[r]);
  Tensor bytes = Tensor::zeros(Shape{1, longest}, DType::u8);  // [1, longest] padded
  std::memcpy(bytes.raw(), mine.data(), mine.size());
  Tensor all = Tensor::empty(Shape{n, longest}, DType::u8);  // [n, longest]
  sched::sync_wait(c.all_gather(bytes, all));
  std::vector<std::string> out;
  const auto* base = static_cast<const char*>(all.raw());
  for (int r = 0; r < n; ++r)
    out.emplace_back(base + int64_t(r) * longest, size_t(sizes.data<int64_t>()[r]));
  return out;
}

void broadcast_bytes(std::string& bytes, Comm& c, int root) {
  REDCO_CHECK(root >= 0 && root < c.size(), "broadcast_bytes: root {} is not a rank of {}", root,
              c.size());
  Tensor size = Tensor::empty(Shape{1}, DType::i64);  // [1] root's byte count
  size.data<int64_t>()[0] = int64_t(bytes.size());
  sched::sync_wait(c.broadcast(size, root));
  const int64_t n = size.data<int64_t>()[0];
  Tensor data = Tensor::empty(Shape{std::max<int64_t>(n, 1)}, DType::u8);  // [max(n, 1)]
  if (c.rank() == root) std::memcpy(data.raw(), bytes.data(), bytes.size());
  sched::sync_wait(c.broadcast(data, root));
  if (c.rank() != root) bytes.assign(static_cast<const char*>(data.raw()), size_t(n));
}

}  // namespace redco::comm
