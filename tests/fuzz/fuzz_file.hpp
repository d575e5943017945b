// The readers under fuzz take a path: each input is written to one memfd (no
// disk) and the reader opens it again through /proc/self/fd/N.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace redco::fuzz {

inline std::string as_file(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("redco-fuzz", 0);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace redco::fuzz
