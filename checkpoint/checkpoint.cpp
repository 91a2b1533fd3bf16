// Sharded save and load; see checkpoint.h.
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "comm/gather_text.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return "F64";
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      throw NotSupportedError(str_cat("checkpoint: dtype ", t,
                                      " has no safetensors name; dtrain saves F64, F32, "
                                      "F16, BF16, I64, I32, I16, I8, U8 and BOOL tensors."));
  }
}

at::ScalarType scalar_type(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types{
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = types.find(name);
  if (it == types.end()) {
    throw ValueError(str_cat("checkpoint: dtype '", name, "' is not one dtrain loads (",
                             "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)."));
  }
  return it->second;
}

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08ld", static_cast<long>(step));
  return buf;
}

Region region_from(const nlohmann::json& j, const std::vector<int64_t>& shape) {
  Region r;
  r.shape = shape;
  r.box_offset = j.at("box_offset").get<std::vector<int64_t>>();
  r.box_sizes = j.at("box_sizes").get<std::vector<int64_t>>();
  r.begin = j.at("begin").get<int64_t>();
  r.count = j.at("count").get<int64_t>();
  return r;
}

struct Block {  // one block of this rank's shard file
  std::string key;
  Region region;
  at::Tensor data;  // 1-d contiguous
  int64_t offset = 0;
};

// Writes this rank's blocks as a safetensors file; returns its FileInfo (name: base name).
FileInfo write_shard(const std::string& path, std::vector<Block>& blocks, int rank, int64_t step) {
  // widest dtypes first: every block then starts aligned to its element size
  std::stable_sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) {
    return a.data.element_size() > b.data.element_size();
  });
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, int> seen;
  int64_t at = 0;
  for (auto& b : blocks) {
    const int64_t bytes = b.region.count * static_cast<int64_t>(b.data.element_size());
    b.offset = at;
    entries.push_back({str_cat(b.key, "#", seen[b.key]++),
                       dtype_name(b.data.scalar_type()),
                       {b.region.count},
                       at,
                       at + bytes});
    at += bytes;
  }
  const std::string header =
      encode_header(entries, {{"format", "dtrain-checkpoint-shard"}, {"rank", std::to_string(rank)}});
  File f(path, File::Mode::kCreate);
  f.write(header.data(), header.size());
  ChunkChecksums crc;
  int64_t written = 0;
  // In pieces of 1 MiB (as dd writes), each checksummed while it is still in the cache, and the writeback of
  // every 32 MiB started at once (sync_file_range): the disk writes while the next pieces are copied, and the
  // final fsync finds little left to do (that fsync was a third of a 300 MB save here).
  constexpr size_t kPiece = size_t{1} << 20, kKick = size_t{32} << 20;
  size_t unkicked = 0;
  for (const auto& b : blocks) {
    const size_t bytes = static_cast<size_t>(b.region.count) * b.data.element_size();
    const char* data = static_cast<const char*>(b.data.data_ptr());
    for (size_t o = 0; o < bytes; o += kPiece) {
      const size_t len = std::min(kPiece, bytes - o);
      f.write(data + o, len);
      crc.add(data + o, len);
      if ((unkicked += len) >= kKick) f.start_writeback(), unkicked = 0;
    }
    written += static_cast<int64_t>(bytes);
    if (written >= at / 2) fault_point("save_write", step);
  }
  f.sync();
  f.close();
  FileInfo info;
  info.name = fs::path(path).filename().string();
  info.bytes = static_cast<int64_t>(header.size()) + at;
  info.data_offset = static_cast<int64_t>(header.size());
  info.crc32 = crc.finish();
  info.header_crc32 = crc32_of(header.data(), header.size());
  return info;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw ValueError(str_cat("checkpoint: cannot remove ", path, ": ", ec.message(), "."));
}

// Rank 0: the partial folder becomes the step's folder, atomically (an older one of the same step swapped out
// and removed), then `latest` moves, then checkpoints beyond `keep` go.
void commit(const std::string& root, const std::string& partial, const std::string& name, int64_t step,
            int64_t keep) {
  const std::string final_dir = root + "/" + name;
  fault_point("save_commit", step);
  if (fs::exists(final_dir)) {
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      throw ValueError(str_cat("checkpoint: cannot replace ", final_dir, ": ", std::strerror(errno), "."));
    }
    sync_dir(root);
    remove_tree(partial);  // (the old one, swapped out)
  } else {
    if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
      throw ValueError(
          str_cat("checkpoint: cannot rename ", partial, " to ", final_dir, ": ", std::strerror(errno), "."));
    }
    sync_dir(root);
  }
  fault_point("save_latest", step);
  write_file_atomic(root + "/latest", name + "\n");
  if (keep <= 0) return;
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.json"))
      steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());  // zero-padded: by step
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    if (steps[i] != name) remove_tree(root + "/" + steps[i]);
  }
}

}  // namespace

std::string save(const std::string& root, int64_t step, const std::vector<Piece>& pieces,
                 const comm::BackendPtr& world, const SaveOptions& opts) {
  const int rank = world->group_rank(), n = world->group_size();
  const std::string name = step_name(step), partial = str_cat(root, "/.", name, ".partial");
  if (step < 0) throw ValueError(str_cat("checkpoint: step ", step, " must not be negative."));
  // What each rank holds, to every rank: pieces held alike by several ranks are written once, split among
  // them.
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& p : pieces) {
    DTRAIN_ASSERT(
        p.data.defined() && p.data.dim() == 1 && p.data.is_contiguous() && p.data.numel() == p.region.count,
        "piece ", p.key, " data ", p.data.defined() ? p.data.sizes() : at::IntArrayRef{});
    mine.push_back({{"key", p.key},
                    {"dtype", dtype_name(p.data.scalar_type())},
                    {"shape", p.region.shape},
                    {"region", region_json(p.region)},
                    {"placement", p.placement}});
  }
  std::vector<nlohmann::json> held;
  for (const auto& text : comm::all_gather_text(world, mine.dump()))
    held.push_back(nlohmann::json::parse(text));
  std::map<std::string, std::vector<int>> holders;  // key + region -> ranks, ascending
  for (int r = 0; r < n; ++r) {
    for (const auto& d : held[r]) holders[d["key"].get<std::string>() + d["region"].dump()].push_back(r);
  }
  std::vector<Block> blocks;
  for (const auto& p : pieces) {
    const auto& who = holders.at(p.key + region_json(p.region).dump());
    const int64_t index = std::find(who.begin(), who.end(), rank) - who.begin();
    const Region part = split(p.region, static_cast<int64_t>(who.size()), index);
    if (part.count == 0 && p.region.count != 0) continue;
    blocks.push_back({p.key, part, p.data.narrow(0, part.begin - p.region.begin, part.count), 0});
  }
  comm::on_every_rank(world, "checkpoint save", [&] {
    if (rank != 0) return;
    fs::create_directories(root);
    for (const auto& e : fs::directory_iterator(root)) {  // partial folders of saves that died
      const std::string f = e.path().filename().string();
      if (f.size() > 8 && f[0] == '.' && f.rfind(".partial") == f.size() - 8) remove_tree(e.path().string());
    }
    fs::create_directory(partial);
  });
  FileInfo info;
  comm::on_every_rank(world, "checkpoint save", [&] {
    char file[32];
    std::snprintf(file, sizeof file, "rank-%05d.safetensors", rank);
    info = write_shard(partial + "/" + file, blocks, rank, step);
    fault_point("save", step);
  });
  nlohmann::json summary{{"name", info.name},
                         {"bytes", info.bytes},
                         {"data_offset", info.data_offset},
                         {"crc32", info.crc32},
                         {"header_crc32", info.header_crc32},
                         {"blocks", nlohmann::json::array()}};
  for (const auto& b : blocks) {
    summary["blocks"].push_back({{"key", b.key}, {"offset", b.offset}, {"region", region_json(b.region)}});
  }
  const auto summaries = comm::all_gather_text(world, summary.dump());
  comm::on_every_rank(world, "checkpoint save", [&] {
    if (rank != 0) return;
    Manifest m;
    m.step = step;
    m.world_size = n;
    m.layout = opts.layout;
    m.meta = opts.meta;
    for (int r = 0; r < n; ++r) {
      for (const auto& d : held[r]) {
        TensorInfo& t = m.tensors[d["key"].get<std::string>()];
        t.dtype = d["dtype"].get<std::string>();
        t.shape = d["shape"].get<std::vector<int64_t>>();
        if (t.placement.empty()) t.placement = d["placement"].get<std::string>();
      }
    }
    for (int r = 0; r < n; ++r) {
      const auto s = nlohmann::json::parse(summaries[r]);
      FileInfo f;
      f.name = s["name"].get<std::string>();
      f.bytes = s["bytes"].get<int64_t>();
      f.data_offset = s["data_offset"].get<int64_t>();
      f.crc32 = s["crc32"].get<std::vector<uint32_t>>();
      f.header_crc32 = s["header_crc32"].get<int64_t>();
      m.files.push_back(f);
      for (const auto& b : s["blocks"]) {
        TensorInfo& t = m.tensors.at(b["key"].get<std::string>());
        t.blocks.push_back({r, b["offset"].get<int64_t>(), region_from(b["region"], t.shape)});
      }
    }
    {
      File f(partial + "/manifest.json", File::Mode::kCreate);
      const std::string text = m.to_json();
      f.write(text.data(), text.size());
      f.sync();
      f.close();
    }
    sync_dir(partial);
    commit(root, partial, name, step, opts.keep);
  });
  return root + "/" + name;
}

std::string resolve(const std::string& path) {
  if (fs::exists(path + "/manifest.json")) return path;
  if (fs::exists(path + "/latest")) {
    std::string name = read_small_file(path + "/latest", 4096);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos ||
        !fs::exists(path + "/" + name + "/manifest.json")) {
      throw ValueError(str_cat("checkpoint: ", path, "/latest names '", name,
                               "', which is not a checkpoint folder there. Name a step folder of ", path,
                               " instead."));
    }
    return path + "/" + name;
  }
  if (!fs::exists(path)) throw ValueError(str_cat("checkpoint: ", path, " does not exist."));
  throw ValueError(str_cat("checkpoint: ", path,
                           " holds neither manifest.json (a step folder) nor 'latest' (a "
                           "checkpoint root). Name a folder that dtrain saved."));
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = step_dir + "/manifest.json";
  return Manifest::parse(path, read_small_file(path, int64_t{1} << 30));
}

Manifest manifest_of_safetensors(const std::string& path, const std::string& prefix) {
  const SafetensorsHeader h = read_header(path);
  Manifest m;
  FileInfo f;
  f.name = fs::path(path).filename().string();
  f.bytes = h.data_offset + h.data_bytes;
  f.data_offset = h.data_offset;
  m.files.push_back(f);
  m.world_size = 1;
  for (const auto& e : h.tensors) {
    TensorInfo t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.placement = "whole";
    t.blocks.push_back({0, e.begin, Region::whole(e.shape)});
    m.tensors[prefix + e.name] = std::move(t);
  }
  return m;
}

}  // namespace dtrain::checkpoint
