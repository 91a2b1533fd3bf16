// The one fault-injection seam. Production code marks points with fault_point(POINT, N) and nothing else; a
// point does nothing unless a test switched injection on, through one of the variables below (read once, here
// only). The rank is the process's global rank (log.h). The fault tier (tests/fault_exit_test.cpp,
// tests/checkpoint_process_test.cpp) uses them:
//   DTRAIN_TEST_FREEZE="<rank>:<point>:<n>"        stop with SIGSTOP, as a machine that stops answering, at
//                                                  any point below; first prints "dtrain test: rank R freezes
//                                                  at POINT N (monotonic ms T)" to stderr, so that a test can
//                                                  time the job's end from the freeze
//   DTRAIN_TEST_KILL_AT_STEP="<rank>:<step>"       SIGKILL at point `step` (a rank lost mid-run), in the
//                                                  group's first attempt only (DTRAIN_RESTART_COUNT unset or
//                                                  0)
//   DTRAIN_TEST_KILL_DURING_SAVE="<rank>:<p>:<step>" SIGKILL at point `save_<p>` (p: write, commit, latest),
//   as
//                                                  a machine dying in the middle of a checkpoint save
// The points:
//   start        after the rank joined the job's store, before its engine connects (n 0)
//   collective   entering the n-th collective of its world group
//   step         beginning training step n
//   save         its shard of step n's checkpoint written, before the checkpoint is committed
//   save_write   half-way through writing its shard file of step n
//   save_commit  rank 0: step n's manifest written, before the checkpoint folder is renamed into place
//   save_latest  rank 0: after the rename, before `latest` moves to step n
//   store        sending its n-th access of the job's store (from the store's helper thread)
#pragma once

#include <cstdint>

namespace dtrain {

void fault_point(const char* point, int64_t n);

}  // namespace dtrain
