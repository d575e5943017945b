#pragma once
// Byte strings across ranks: what a program sends that is not a tensor (a
// cereal archive of predictions, a server's new requests). Built on a Comm's
// tensor collectives: the lengths first, then the bytes. Blocking; every rank
// of the group calls them in the same order, as any collective.
#include <string>
#include <vector>

#include "redco/comm/comm.hpp"

namespace redco::comm {

// Every rank's bytes, indexed by its rank in `c` (an empty string travels too).
std::vector<std::string> all_gather_bytes(const std::string& mine, Comm& c);

// Rank `root`'s bytes into `bytes` on every rank of `c` (root's are left as they are).
void broadcast_bytes(std::string& bytes, Comm& c, int root = 0);

}  // namespace redco::comm
