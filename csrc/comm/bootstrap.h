// Bootstrap of a communicator through a torch.distributed Store (TCPStore, FileStore, PrefixStore: the
// stores torchrun and init_process_group set up): rank 0 publishes a blob (the ncclUniqueId) under a
// key, every other rank waits for that key and reads it. No transport of our own.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace stfast::comm {

// Rank 0 sets `key` to `root_value` and returns it; every other rank waits up to `timeout` for `key`
// and returns its value. A timeout (or a store failure) throws c10::Error naming the rank, the key
// and the timeout, followed by the store's own message.
std::string exchange_through_store(c10d::Store& store, int rank, const std::string& key,
                                   const std::string& root_value, std::chrono::milliseconds timeout);

}  // namespace stfast::comm
