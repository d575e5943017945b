#include "redco/ops/cuda/cublas_api.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>
#include <vector>

#include "redco/core/error.hpp"

namespace redco::cuda {
namespace {

#define REDCO_STR2(x) #x
#define REDCO_STR(x) REDCO_STR2(x)
constexpr const char* kLibrary = "libcublas.so." REDCO_STR(CUBLAS_VER_MAJOR);

// Where to look: the loader's search path (ld.so.cache, LD_LIBRARY_PATH),
// then the directory libcudart was loaded from (cuBLAS sits next to the
// runtime in a toolkit), then the toolkit redco was built against.
void* open_library(std::string& tried) {
  std::vector<std::string> candidates{kLibrary};
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) && info.dli_fname) {
    const std::string runtime = info.dli_fname;
    candidates.push_back(runtime.substr(0, runtime.find_last_of('/') + 1) + kLibrary);
  }
#ifdef REDCO_CUDA_LIBDIR
  candidates.push_back(std::string(REDCO_CUDA_LIBDIR) + "/" + kLibrary);
#endif
  for (const std::string& path : candidates) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    tried += (tried.empty() ? "" : ", ") + path + " (" + dlerror() + ")";
  }
  return nullptr;
}

// The alias must name an overload cuBLAS declares (checked unevaluated:
// nothing here may reference a cuBLAS symbol, or the linker would want it).
static_assert(sizeof(static_cast<GemmStridedBatchedEx>(&cublasGemmStridedBatchedEx)) > 0);

template <typename F>
void resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  REDCO_CHECK(fn != nullptr,
              "CUDA backend: {} has no symbol {}: the cuBLAS found is older than the toolkit "
              "redco was built with (cuBLAS {}); put the matching one first on LD_LIBRARY_PATH",
              kLibrary, name, CUBLAS_VER_MAJOR);
}

CublasApi load() {
  std::string tried;
  void* lib = open_library(tried);
  REDCO_CHECK(lib != nullptr,
              "CUDA backend: cannot open cuBLAS, needed for GEMMs on the GPU; tried {}. Install "
              "the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH",
              tried);
  CublasApi api{};
  resolve(lib, "cublasCreate_v2", api.create);
  resolve(lib, "cublasSetStream_v2", api.set_stream);
  resolve(lib, "cublasSetWorkspace_v2", api.set_workspace);
  resolve(lib, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex);
  resolve(lib, "cublasGetStatusString", api.status_string);
  resolve(lib, "cublasGetStatusName", api.status_name);
  return api;  // the library stays open for the life of the process
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();
  return api;
}

const char* cublas_library_name() { return kLibrary; }

}  // namespace redco::cuda
