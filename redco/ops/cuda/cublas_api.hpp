// cuBLAS, opened on first use instead of linked.
//
// Linking libcublas costs every redco process ~150 MB of resident memory at
// start-up (cuBLASLt's relocated tables and its static data), GPU or not: on
// a CPU-only run of a CUDA-enabled build that was 5% of GPT-2 training's
// peak RSS. So the CUDA backend calls cuBLAS through these pointers, which
// are resolved from libcublas.so.<major> by dlopen the first time a GEMM
// runs on a GPU. The types come from cublas_v2.h, so every call is still
// checked against the real signatures at compile time.
#pragma once

#include <cublas_v2.h>

namespace redco::cuda {

// cublasGemmStridedBatchedEx with a cublasComputeType_t, the C entry point
// (C++ code also sees an inline overload taking a cudaDataType).
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                                cublasOperation_t, int, int, int, const void*,
                                                const void*, cudaDataType, int, long long,
                                                const void*, cudaDataType, int, long long,
                                                const void*, void*, cudaDataType, int, long long,
                                                int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  GemmStridedBatchedEx gemm_strided_batched_ex;
  decltype(&cublasGetStatusString) status_string;
  decltype(&cublasGetStatusName) status_name;
};

// The library, opened once (thread-safe); fails with a message naming the
// library and the fix when it cannot be found or lacks a symbol.
const CublasApi& cublas();

// The file name tried first, e.g. "libcublas.so.13".
const char* cublas_library_name();

}  // namespace redco::cuda
