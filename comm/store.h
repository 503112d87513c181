// comm/store.h: the key-value store ranks meet through when MPI does not
// start them (Note [Rank discovery] in comm/rank_discovery.h): torchrun's
// agent's TCP store, or one rank 0 starts, handed in by the Python package
// (python/src/world.cc), or files in a shared directory.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace mp {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting until some rank has set it; CommError
  // naming the key after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// One file per key in `directory` (which every rank sees, e.g. on a shared
// file system), written whole before it appears (a rename).
std::shared_ptr<KeyValueStore> make_file_store(const std::string& directory);

}  // namespace mp
