// FailureBoard: job-wide failure reports through the job's key-value store, so that an error raised on one
// rank only (an exception inside a DTensor op on that rank) reaches the others within a fraction of a second
// instead of leaving them in their next collective until the timeout. A rank posts its error; every rank
// waiting in a collective reads the board every kPollInterval (only once the collective has waited that long,
// so fast collectives never touch the store) and raises the error as its own CommError.
//
// A report carries a tag naming the operation that failed ("dtensor op 57"). A rank that failed at the same
// tag itself ignores it: every rank raised the same error (bad input, strict mode), and a program may catch
// it and go on.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "comm/detail/bounded_store.h"

namespace dtrain::comm {

// Thread-safe.
class FailureBoard {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{200};

  // How long a post or a read may wait for the store.
  static constexpr std::chrono::milliseconds kStoreBound{1000};

  FailureBoard(c10::intrusive_ptr<BoundedStore> store, int global_rank)
      : store_(std::move(store)), rank_(global_rank) {}

  // Posts this rank's failure at `tag` (and remembers the tag as failed here). Never throws: it runs while an
  // error is already on its way up.
  void post(const std::string& tag, const std::string& message);
  // "rank 2 failed in dtensor op 57: <its message>" for the first failure another rank posted at a tag this
  // process did not fail at; nullopt when there is none or the store cannot be read.
  std::optional<std::string> foreign_failure();

 private:
  c10::intrusive_ptr<BoundedStore> store_;
  int rank_;
};

}  // namespace dtrain::comm
