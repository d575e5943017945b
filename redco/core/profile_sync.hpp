#pragma once
// A device backend's hook for profile:: scopes. Device work is queued
// asynchronously, so a scope's wall time would measure only the launches;
// with a hook set, every scope waits for the device when it opens and when it
// closes while profiling is on, and the time of the queued work lands in the
// op that queued it. Set once by the CUDA backend; nothing else calls it.
namespace redco::profile {
void set_device_sync(void (*sync)());
}  // namespace redco::profile
