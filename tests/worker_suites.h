// The DTensor suites of tests/comm_worker (tests/worker_dtensor.cpp), run as ranks by
// tests/comm_process_test.
#pragma once

#include "comm/backend.h"

namespace dtrain::test {

// Every placement pair through the redistribution executor on 1-d meshes and, at 2 and 4 ranks, 2-d meshes.
void suite_redistribute(const comm::BackendPtr& world);
// The validation matrix of the ops with sharding rules (1-d mesh; also 2x2 at 4 ranks).
void suite_ops(const comm::BackendPtr& world);
// DTensor end to end: creation, ops, fallback, strict mode, gradients, nn::Linear + AdamW, comm accounting.
void suite_dtensor(const comm::BackendPtr& world);
// models::GPT, one forward + backward + AdamW step in the data parallel, Megatron and (4 ranks) 2-d layouts,
// against the same model on one process.
void suite_gpt(const comm::BackendPtr& world);

}  // namespace dtrain::test
