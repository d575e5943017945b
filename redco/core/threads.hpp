#pragma once
// How many CPU threads redco computes with, for the whole process (like
// PyTorch's torch.set_num_threads or llama-bench -t). Every parallel loop of
// redco's CPU kernels runs on oneTBB, and oneDNN's GEMMs run inside those
// loops one thread each, so capping oneTBB's workers caps them all. A run can
// then be pinned to N cores' worth of threads (with taskset/numactl for
// which cores) and compared with another engine given the same N.
namespace redco {

// Caps the threads at n >= 1; 0 lifts the cap again (oneTBB's default: one
// thread per core this process may run on).
void set_num_threads(int n);
// The threads parallel loops may use now.
int num_threads();

}  // namespace redco
