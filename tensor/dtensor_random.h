// DTensor random numbers: one counter-based (Philox) stream per process, the same on every rank, so that a
// random op on a DTensor gives the values one process would give the global tensor, whatever the placements
// and the world size, and each rank draws only its own block (PyTorch's DTensor does the same with its
// offset-based RNG tracker on CUDA).
//
//   element i (row-major index in the global tensor) of the k-th random op draws the 128-bit Philox block
//   (seed, subsequence = i, offset = k); uniform values use its first 53 bits (24 for float), normal values
//   Box-Muller on its four words.
//
// The state (seed, k) is made the same on every rank at the first random op on each mesh: mesh rank 0's
// state is broadcast (one small collective), so ranks seeded differently (at::manual_seed(rank)) still draw
// one Replicate mask. Until manual_seed() is called the seed is rank 0's default CPU generator's seed at
// that point. Explicit generators are refused on DTensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tensor/dtensor.h"

namespace dtrain::tensor {

// Sets the DTensor stream's seed (and restarts it) on this rank; call it with the same seed on every rank
// (the next random op on a mesh shares mesh rank 0's state anyway).
void manual_seed(uint64_t seed);

namespace detail {

enum class RandomKind { kUniform, kNormal, kBernoulli };

// Fills `block` (a contiguous tensor: this rank's block of a global tensor of `global_shape`, at `offset`)
// with the draws of the next random op on `mesh`: uniform in [a, b), normal(a, b) (mean, std), or
// bernoulli(a) (1 with probability a). Every rank of the mesh must call it for the same op.
void random_fill(at::Tensor& block, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& offset, const MeshPtr& mesh, RandomKind kind, double a,
                 double b);

}  // namespace detail

}  // namespace dtrain::tensor
