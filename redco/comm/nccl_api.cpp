#include "redco/comm/nccl_api.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <vector>

#include "redco/core/error.hpp"

namespace redco::comm {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

// The loader's search path first, then the toolkit redco was built against
// (NCCL ships in the CUDA toolkit's lib directory on some installs).
void* open_library(std::string& tried) {
  std::vector<std::string> candidates{kLibrary};
#ifdef REDCO_CUDA_LIBDIR
  candidates.push_back(std::string(REDCO_CUDA_LIBDIR) + "/" + kLibrary);
  candidates.push_back(std::string(REDCO_CUDA_LIBDIR) + "/../lib/" + kLibrary);
#endif
  for (const std::string& path : candidates) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    tried += (tried.empty() ? "" : ", ") + path + " (" + dlerror() + ")";
  }
  return nullptr;
}

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return fn != nullptr;
}

struct Loaded {
  NcclApi api{};
  std::string why;  // empty when api is usable
};

Loaded load() {
  Loaded l;
  std::string tried;
  void* lib = open_library(tried);
  if (!lib) {
    l.why = "cannot open NCCL: tried " + tried;
    return l;
  }
  NcclApi& a = l.api;
  std::string missing;
  resolve(lib, "ncclGetVersion", a.get_version, missing);
  resolve(lib, "ncclGetUniqueId", a.get_unique_id, missing);
  resolve(lib, "ncclCommInitRank", a.comm_init_rank, missing);
  resolve(lib, "ncclCommDestroy", a.comm_destroy, missing);
  resolve(lib, "ncclCommAbort", a.comm_abort, missing);
  resolve(lib, "ncclCommGetAsyncError", a.comm_get_async_error, missing);
  resolve(lib, "ncclGetErrorString", a.get_error_string, missing);
  resolve(lib, "ncclGetLastError", a.get_last_error, missing);
  resolve(lib, "ncclAllReduce", a.all_reduce, missing);
  resolve(lib, "ncclReduceScatter", a.reduce_scatter, missing);
  resolve(lib, "ncclAllGather", a.all_gather, missing);
  resolve(lib, "ncclBroadcast", a.broadcast, missing);
  if (!missing.empty()) {
    l.why = std::string(kLibrary) + " has no " + missing + " (NCCL 2.13 or newer is needed)";
    return l;
  }
  if (a.get_version(&a.version) != ncclSuccess) a.version = 0;
  // ncclAvg (the mean) arrived in 2.10, ncclGetLastError in 2.13.
  if (a.version < 21300)
    l.why = fmt::format("NCCL {} is too old (2.13 or newer is needed)", a.version);
  return l;  // the library stays open for the life of the process
}

}  // namespace

const NcclApi* nccl_api(std::string* why) {
  static const Loaded loaded = load();
  if (why) *why = loaded.why;
  return loaded.why.empty() ? &loaded.api : nullptr;
}

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const NcclApi* api = nccl_api(nullptr);
  const char* last = api && comm ? api->get_last_error(comm) : nullptr;
  fail("NCCL error in {}: {}{}{}", what, api ? api->get_error_string(r) : "unknown",
       last && *last ? ": " : "", last ? last : "");
}

}  // namespace redco::comm
