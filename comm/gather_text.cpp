// Collectives of text and of errors; see gather_text.h.
#include "comm/gather_text.h"

#include <ATen/ATen.h>

#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

std::vector<std::string> all_gather_text(const comm::BackendPtr& world, const std::string& text) {
  const int n = world->group_size();
  if (n == 1) return {text};
  at::Tensor len = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  world->all_gather(lens, len)->wait();
  std::vector<int64_t> words(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += words[r] = (lens.data_ptr<int64_t>()[r] + 7) / 8;
  at::Tensor mine = at::zeros({words[world->group_rank()]}, at::kLong);
  std::memcpy(mine.data_ptr(), text.data(), text.size());
  at::Tensor all = at::empty({total}, at::kLong);
  world->all_gather_v(all, mine, words)->wait();
  std::vector<std::string> out;
  const char* p = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    out.emplace_back(p, static_cast<size_t>(lens.data_ptr<int64_t>()[r]));
    p += words[r] * 8;
  }
  return out;
}

void on_every_rank(const comm::BackendPtr& world, const std::string& what, const std::function<void()>& fn) {
  std::string error;
  try {
    fn();
  } catch (const CommError&) {
    throw;  // the group is broken: the other ranks hear of it from the communication layer
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "an error without a message";
  }
  if (world->group_size() == 1) {
    if (!error.empty()) throw ValueError(error);
    return;
  }
  at::Tensor failed = at::full({1}, error.empty() ? int64_t{0} : int64_t{1}, at::kLong);
  world->all_reduce(failed, {comm::ReduceOp::kSum})->wait();
  const int64_t failures = failed.item<int64_t>();
  if (failures == 0) return;
  const auto errors = all_gather_text(world, error);
  for (int r = 0; r < world->group_size(); ++r) {
    if (errors[r].empty()) continue;
    if (r == world->group_rank()) throw ValueError(error);
    throw ValueError(str_cat(rank_prefix(), " ", what, " failed on rank ", r,
                             failures > 1 ? str_cat(" (and ", failures - 1, " other ranks)") : std::string(),
                             ": ", errors[r]));
  }
}

}  // namespace dtrain::comm
