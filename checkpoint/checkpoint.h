// Sharded checkpoints (DESIGN §6): each rank saves the pieces of global tensors it holds, and loads the
// pieces its layout needs now, whatever layout saved them. The strategies' state is turned into pieces by
// checkpoint/training_state.h; this file knows only pieces, files and ranks.
//
// Save (collective): the ranks exchange what they hold; pieces several ranks hold alike (replicas) are
// written once, their range split among the holders; each rank writes one safetensors file of its blocks into
// a partial folder, synced; rank 0 then writes manifest.json, syncs, renames the folder to step-<step>, and
// moves `latest` last; older checkpoints beyond `keep` go. A rank or machine that dies anywhere in this
// leaves the previous checkpoint whole and `latest`.
//
// Load (collective): every rank reads the manifest, works out which saved byte ranges its pieces need (runs
// of global indices, region.h), reads only the 1 MiB chunks covering them, checks their CRC-32, and fills new
// tensors. Any failure on any rank (a missing file, a bad checksum, a name or shape the caller does not
// expect) is raised on every rank, before the caller changes anything.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/region.h"
#include "comm/backend.h"

namespace dtrain::checkpoint {

struct Piece {
  std::string key;  // "model/h0.attn.q.weight", "optim/exp_avg/h0.attn.q.weight", ...
  // Save: 1-d, contiguous, on the CPU, region.count elements. Load: the dtype this rank expects (its values
  // are not read).
  at::Tensor data;
  Region region;
  std::string placement;   // in words, for the manifest
  bool optional = false;   // load: absent from the checkpoint gives an undefined tensor instead of an error
  bool any_dtype = false;  // load: the checkpoint's dtype is accepted whatever it is (the caller casts)
};

// safetensors' dtype names for libtorch's dtypes, and back; ValueError for one with no name.
std::string dtype_name(at::ScalarType t);
at::ScalarType scalar_type(const std::string& name);

struct SaveOptions {
  int64_t keep = 0;  // checkpoints left in the root after this one, the newest (0: all)
  nlohmann::json layout = nlohmann::json::object();  // rank 0's goes into the manifest
  nlohmann::json meta = nlohmann::json::object();    // rank 0's goes into the manifest
};

// Collective over `world`. Returns the step folder's path.
std::string save(const std::string& root, int64_t step, const std::vector<Piece>& pieces,
                 const comm::BackendPtr& world, const SaveOptions& opts = {});

// The step folder `path` names: itself when it holds manifest.json, else the one its `latest` names.
// ValueError saying what is there otherwise.
std::string resolve(const std::string& path);
Manifest read_manifest(const std::string& step_dir);

// Collective over `world`: `check` (if given) runs first with the manifest on every rank; then, per piece, a
// new tensor of the checkpoint's dtype holding the piece's elements (undefined for an optional piece the
// checkpoint lacks). Raises the first failing rank's error on every rank.
std::vector<at::Tensor> load(const std::string& step_dir, const std::vector<Piece>& pieces,
                             const comm::BackendPtr& world,
                             const std::function<void(const Manifest&)>& check = {});

// One process, no collective: the pieces' elements from the checkpoint in `step_dir` (its manifest `m`).
std::vector<at::Tensor> read_pieces(const std::string& step_dir, const Manifest& m,
                                    const std::vector<Piece>& pieces);

// A consolidated safetensors file (an export) seen as a checkpoint: one whole block per tensor, named
// `prefix` + its name; no checksums (the format has none).
Manifest manifest_of_safetensors(const std::string& path, const std::string& prefix);

// Reads every byte of every shard file and checks it against the manifest's checksums. ValueError naming the
// first file and chunk that fails.
void verify_files(const std::string& step_dir, const Manifest& m);

}  // namespace dtrain::checkpoint
