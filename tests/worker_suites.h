// The DTensor suites of tests/comm_worker (tests/worker_dtensor.cpp), run as ranks by
// tests/comm_process_test.
#pragma once

#include <string>

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
// DTensor hardening: out= reductions, casts of Partial, meshes compared by ranks, DTensor's random stream,
// plain tensors and decisions checked across ranks, views, from_local gradients, uneven and empty blocks,
// bounded caches.
void suite_hardening(const comm::BackendPtr& world);
// The last rank raises inside a DTensor op; every rank writes "<dir>/failfast<rank>.txt" with when it raised
// (or caught the error) and the message.
void suite_failfast(const comm::BackendPtr& world, const std::string& dir);

}  // namespace dtrain::test
