// Test-only fault points, for the fault suite (tests/fault_exit_test.cpp); nothing here acts unless its
// variable is set. DTRAIN_TEST_FREEZE="<rank>:<point>:<n>" stops the process of global rank <rank> with
// SIGSTOP, as a machine that stops answering would, when it reaches <point> with count <n>:
//   start       after it joined the job's store, before its engine connects (n 0)
//   collective  entering the n-th collective of its world group
//   step        beginning training step n
//   save        its shard of step n's checkpoint written, before the checkpoint is committed
//   store       sending its n-th access of the job's store (from the store's helper thread)
// Just before it stops it prints "dtrain test: rank R freezes at POINT N (monotonic ms T)" to stderr, so that
// a test can time the job's end from the freeze.
#pragma once

#include <cstdint>

namespace dtrain {

void test_freeze_point(const char* point, int64_t n);

}  // namespace dtrain
