#pragma once
// NCCL's entry points, opened at run time (dlopen) like cuBLAS: a build with
// the CUDA toolkit links no NCCL, so a machine without it still runs redco
// (device collectives then go through the host world, staged).
#include <nccl.h>

#include <string>

namespace redco::comm {

struct NcclApi {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) comm_init_rank;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommGetAsyncError) comm_get_async_error;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclGetLastError) get_last_error;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclReduceScatter) reduce_scatter;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclBroadcast) broadcast;
  int version = 0;  // e.g. 22805 for 2.28.5
};

// The library, opened once per process; null when it cannot be opened or
// lacks a symbol, with the reason in *why.
const NcclApi* nccl_api(std::string* why);

// Throws redco::Error naming `what`, NCCL's error string and its last error
// message for `comm` (null: none yet).
void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace redco::comm
