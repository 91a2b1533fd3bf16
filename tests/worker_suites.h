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
// parallel::DataParallel on models::GPT: parity with one process (accumulation 1 and 4, one and several
// buckets), communication per step, broadcast of rank 0's weights, unused parameters, different modules.
void suite_data_parallel(const comm::BackendPtr& world);
// parallel::Zero stages 1 and 2: the same parity (accumulation 1 and 4, one and several buckets), the
// reduce-scatters of backward and the all-gathers of the step, the memory report.
void suite_zero(const comm::BackendPtr& world);
void suite_hsdp(const comm::BackendPtr& world);
// ZeRO-3's memory from the allocator (tests/worker_memory.cpp): built on the meta device, and its training
// peak.
void check_zero_memory(const comm::BackendPtr& world);
// Tensor parallel over the whole world (tests/worker_tp.cpp): models::GPT with and without sequence
// parallel at accumulation 1 and 4, 20 steps equal to one process, the collectives of each block; a module
// written in the test under a plan of its own; the plan's errors.
void suite_tp(const comm::BackendPtr& world);
// 2-d at 4 ranks: dp × tp and zero3 × tp on a [2, 2] mesh, the same parity; and with the mesh's axes the
// other way round (mesh order tp,dp).
void suite_tp2d(const comm::BackendPtr& world);
// The planner from C++ (tests/worker_plan.cpp): plan::plan_module for a module written in the test with a
// tensor-parallel plan of its own, its chosen candidate (and the fastest tp one) trained by the Trainer
// through train::apply_plan, each step's loss equal to one process's; profiles cached under dir.
void suite_plan_module(const comm::BackendPtr& world, const std::string& dir);
// optim::clip_grad_norm (tests/worker_numerics.cpp) under dp, zero1-3, hsdp (4 ranks), tp with and without
// sequence parallel, dp, zero1 and zero3 × tp (4 ranks): the norm equal to one process's, one all-reduce of 8
// bytes, 5 steps equal to one process clipping with libtorch.
void suite_clip(const comm::BackendPtr& world);
// The composition matrix (issue 12): {dp, zero1-3, tp} at 2 or 3 ranks, {hsdp, zero3 x tp} on 2x2, each x
// {fp32, bf16, fp16} x accumulation {1, 4} with clipping, against one process in the same precision.
void suite_matrix(const comm::BackendPtr& world);
// Deterministic mode at 1, 2 or 4 ranks (dp, zero1-3): bitwise equal to plain libtorch summing the
// micro-batches as the same tree; with clipping and 16-bit precision, the parameters' digests written to
// dir/digests.txt for the test to compare across world sizes; its refusals.
void suite_deterministic(const comm::BackendPtr& world, const std::string& dir);
// Activation checkpointing per block under dp, zero1-3, tp (2+ ranks), hsdp and zero3 x tp (4 ranks), in
// float64 against one process without it; dropout's masks replayed (1 rank).
void suite_checkpointing(const comm::BackendPtr& world);

void suite_gpt(const comm::BackendPtr& world);
// A solved step (tests/worker_solved.cpp): an MLP and models::GPT recorded on one rank, solved for the
// world's mesh under a memory budget, and trained a few steps by the plan (tensor::FollowPlan) equal to one
// process.
void suite_solved(const comm::BackendPtr& world);
// DTensor hardening: out= reductions, casts of Partial, meshes compared by ranks, DTensor's random stream,
// plain tensors and decisions checked across ranks, views, from_local gradients, uneven and empty blocks,
// bounded caches.
void suite_hardening(const comm::BackendPtr& world);
// The last rank raises inside a DTensor op; every rank writes "<dir>/failfast<rank>.txt" with when it raised
// (or caught the error) and the message.
void suite_failfast(const comm::BackendPtr& world, const std::string& dir);

// Fault suites (tests/worker_faults.cpp), for tests/fault_test.cpp.
// Rank 0 stops itself (SIGSTOP) after one all_reduce; the others enter the next and write "freeze<r>.txt"
// with the elapsed time and the error, then exit with code 3.
void suite_freeze(const comm::BackendPtr& world, const std::string& dir);
// Writes "pid<r>.txt", passes a barrier, then sleeps for a minute without printing.
void suite_linger(const comm::BackendPtr& world, const std::string& dir);
// Writes "pid<r>.txt", passes a barrier, waits for the file "go" in `dir` (60 s at most), then checks one
// all_reduce.
void suite_await_go(const comm::BackendPtr& world, const std::string& dir);
// The last rank returns (exit code 0) after a barrier; the others enter an all_reduce and write
// "early<r>.txt" with the error, then exit with code 3.
void suite_early_exit(const comm::BackendPtr& world, const std::string& dir);
// One all_reduce, then "ready<r>.txt", then an all_reduce every 50 ms until one fails (the test cuts the
// link): writes "cut<r>.txt" with that op's elapsed time and error, then exits with code 3.
void suite_cut_link(const comm::BackendPtr& world, const std::string& dir);
// The last rank differs from the others in `which` (dtype, count, op, root, skip, gather-counts, mesh); every
// rank writes "mismatch<r>.txt": "caught <message>" or "completed".
void suite_mismatch(const comm::BackendPtr& world, const std::string& dir, const std::string& which);

}  // namespace dtrain::test
