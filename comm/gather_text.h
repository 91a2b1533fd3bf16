// Collectives over a group for what is not a tensor: every rank's text, and an error on any rank raised on
// every rank. Used by checkpoints (a load that fails on one rank fails on all) and by the trainer's timeline.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace dtrain::comm {

// Every rank's `text`, in rank order (a collective of two all_gathers).
std::vector<std::string> all_gather_text(const BackendPtr& world, const std::string& text);

// Runs `fn` on every rank of `world`; when it throws on any rank, every rank throws a ValueError (a CommError
// stays one) with the first failing rank's message, so that no rank goes on, or waits, alone. `what` names
// the operation in the message.
void on_every_rank(const BackendPtr& world, const std::string& what, const std::function<void()>& fn);

}  // namespace dtrain::comm
