#include "comm/bootstrap.h"

#include <c10/util/Exception.h>

namespace stfast::comm {

namespace {
// The store's message without the C++ backtrace c10::Error::what() carries.
std::string message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}
}  // namespace

std::string exchange_through_store(c10d::Store& store, int rank, const std::string& key,
                                   const std::string& root_value, std::chrono::milliseconds timeout) {
  TORCH_CHECK(rank >= 0, "exchange_through_store: rank must be >= 0, got ", rank);
  TORCH_CHECK(!key.empty(), "exchange_through_store: key must not be empty");
  if (rank == 0) {
    try {
      store.set(key, std::vector<uint8_t>(root_value.begin(), root_value.end()));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "stfast communicator bootstrap: rank 0 could not publish key '", key,
                  "' in the store: ", message(e));
    }
    return root_value;
  }
  std::vector<uint8_t> value;
  try {
    // wait() with an explicit timeout throws (DistStoreError) when the key does not appear in time.
    store.wait({key}, timeout);
    value = store.get(key);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "stfast communicator bootstrap: rank ", rank, " did not get key '", key,
                "' (published by rank 0) from the store within ", std::chrono::duration<double>(timeout).count(),
                " s (timeout): ", message(e));
  }
  return std::string(value.begin(), value.end());
}

}  // namespace stfast::comm
