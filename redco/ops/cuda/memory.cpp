// Device memory for the CUDA backend: a caching allocator over cudaMalloc,
// one stream per device, the copies and conversions Tensor needs, and the
// static registration of both the memory and the backend.
//
// The cache keeps freed blocks in size-class free lists, like the CPU
// allocator: cudaMalloc/cudaFree synchronise the device and cost tens of
// microseconds, so a training step must not call them. Blocks are reused at
// once on free; that is safe because all work of a device runs on its one
// stream (see cuda_util.hpp), so the next user of a block is ordered after
// the last.
#include <algorithm>
#include <array>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "redco/core/device_memory.hpp"
#include "redco/core/error.hpp"
#include "redco/core/profile_sync.hpp"
#include "redco/ops/backend.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cuda_backend.hpp"
#include "redco/ops/cuda/cuda_util.hpp"

// Referenced through the linker (-u) so that a static libredco keeps this
// object, and with it the registration below.
extern "C" {
int redco_cuda_anchor = 0;
}

namespace redco::cuda {
namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kLargeBlock = size_t(1) << 20;
constexpr size_t kLargeRound = size_t(2) << 20;

void check_index(int device) {
  REDCO_CHECK(device >= 0 && device < kMaxDevices, "cuda:{} is not a valid device index", device);
}

// Makes `device` current for the scope, restoring the previous one.
struct DeviceGuard {
  int prev;
  explicit DeviceGuard(int device) : prev(current_device()) {
    if (prev != device) set_device(device);
  }
  ~DeviceGuard() {
    if (prev != current_device()) cudaSetDevice(prev);
  }
};

size_t round_size(size_t bytes) {
  if (bytes <= 512) return 512;
  if (bytes >= kLargeBlock) return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
  size_t pow2 = 512;
  while (pow2 * 2 < bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

struct Pool {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_lists;  // capacity -> blocks
  AllocatorStats stats;
};

class CudaMemory final : public DeviceMemory {
 public:
  void* allocate(int device, size_t bytes, size_t* capacity) override {
    check_index(device);
    const size_t cap = round_size(bytes);
    *capacity = cap;
    Pool& p = pools_[size_t(device)];
    {
      std::lock_guard lock(p.mu);
      auto it = p.free_lists.find(cap);
      if (it != p.free_lists.end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        p.stats.bytes_cached -= cap;
        note_use(p.stats, cap);
        ++p.stats.cache_hits;
        return ptr;
      }
    }
    DeviceGuard guard(device);
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, cap) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error before retrying
      release(device);
      REDCO_CUDA(cudaMalloc(&ptr, cap));
    }
    std::lock_guard lock(p.mu);
    ++p.stats.system_allocs;
    note_use(p.stats, cap);
    return ptr;
  }

  void deallocate(int device, void* ptr, size_t capacity) override {
    Pool& p = pools_[size_t(device)];
    std::lock_guard lock(p.mu);
    p.free_lists[capacity].push_back(ptr);
    p.stats.bytes_in_use -= capacity;
    p.stats.bytes_cached += capacity;
  }

  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    DeviceGuard guard(dd.is_cpu() ? sd.index : dd.index);
    REDCO_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
    // The host reads dst as soon as we return.
    if (dd.is_cpu()) REDCO_CUDA(cudaStreamSynchronize(stream()));
  }

  void fill(int device, void* p, DType dt, int64_t n, float value) override {
    DeviceGuard guard(device);
    if (value == 0.f)
      REDCO_CUDA(cudaMemsetAsync(p, 0, size_t(n) * dtype_size(dt), stream()));
    else
      k::fill(p, dt, n, value);
  }

  void convert(int device, void* dst, DType dd, const void* src, DType sd, int64_t n) override {
    DeviceGuard guard(device);
    k::convert(dst, dd, src, sd, n);
  }

  int device_count() const override { return cuda::device_count(); }
  AllocatorStats stats(int device) const override {
    check_index(device);
    Pool& p = pools_[size_t(device)];
    std::lock_guard lock(p.mu);
    return p.stats;
  }

  // Frees every cached block of `device`.
  void release(int device) {
    DeviceGuard guard(device);
    Pool& p = pools_[size_t(device)];
    cudaStreamSynchronize(stream());
    std::lock_guard lock(p.mu);
    for (auto& [cap, blocks] : p.free_lists)
      for (void* b : blocks) cudaFree(b);
    p.free_lists.clear();
    p.stats.bytes_cached = 0;
  }

 private:
  static void note_use(AllocatorStats& s, size_t cap) {
    s.bytes_in_use += cap;
    s.peak_bytes_in_use = std::max(s.peak_bytes_in_use, s.bytes_in_use);
  }
  mutable std::array<Pool, kMaxDevices> pools_;
};

CudaMemory& memory() {
  // Leaked on purpose: tensors in static objects may be freed after main().
  static CudaMemory* m = new CudaMemory();
  return *m;
}

struct Registrar {
  Registrar() {
    register_device_memory(DeviceKind::cuda, &memory());
    register_backend(DeviceKind::cuda, &CudaBackend::instance());
  }
} registrar;

}  // namespace

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // reset the (non-sticky) error so later calls are not blamed
  fail("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("CUDA kernel '{}' failed to launch: {}", kernel, cudaGetErrorString(e));
}

int current_device() {
  int d = 0;
  REDCO_CUDA(cudaGetDevice(&d));
  return d;
}

void set_device(int device) { REDCO_CUDA(cudaSetDevice(device)); }

cudaStream_t stream() {
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::array<std::once_flag, kMaxDevices> once;
  const int d = current_device();
  check_index(d);
  std::call_once(once[size_t(d)], [&] {
    REDCO_CUDA(cudaStreamCreateWithFlags(&streams[size_t(d)], cudaStreamNonBlocking));
    // Profiled scopes wait for the device (profile_sync.hpp) once it has work.
    profile::set_device_sync([] { cudaDeviceSynchronize(); });
  });
  return streams[size_t(d)];
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void synchronize(int device) {
  DeviceGuard guard(device);
  REDCO_CUDA(cudaStreamSynchronize(stream()));
}

AllocatorStats memory_stats(int device) { return memory().stats(device); }
void empty_cache(int device) { memory().release(device); }

}  // namespace redco::cuda
