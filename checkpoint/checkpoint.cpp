// Sharded save and load; see checkpoint.h.
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
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

// Test-only: DTRAIN_TEST_KILL_DURING_SAVE="<rank>:<point>:<step>" kills this process with SIGKILL at `point`
// of the save of step `step` (write: half-way through its shard file; commit: rank 0, the manifest written,
// before the rename; latest: rank 0, after the rename, before `latest` moves), as a machine dying there
// would.
void test_kill_point(int rank, const char* point, int64_t step) {
  const char* spec = std::getenv("DTRAIN_TEST_KILL_DURING_SAVE");
  if (spec == nullptr) return;
  if (std::string(spec) == str_cat(rank, ":", point, ":", step)) ::raise(SIGKILL);
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
  for (const auto& b : blocks) {
    const size_t bytes = static_cast<size_t>(b.region.count) * b.data.element_size();
    f.write(b.data.data_ptr(), bytes);
    crc.add(b.data.data_ptr(), bytes);
    written += static_cast<int64_t>(bytes);
    if (written >= at / 2) test_kill_point(rank, "write", step);
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
  test_kill_point(0, "commit", step);
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
  test_kill_point(0, "latest", step);
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
  for (const auto& text : all_gather_text(world, mine.dump())) held.push_back(nlohmann::json::parse(text));
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
  on_every_rank(world, "checkpoint save", [&] {
    if (rank != 0) return;
    fs::create_directories(root);
    for (const auto& e : fs::directory_iterator(root)) {  // partial folders of saves that died
      const std::string f = e.path().filename().string();
      if (f.size() > 8 && f[0] == '.' && f.rfind(".partial") == f.size() - 8) remove_tree(e.path().string());
    }
    fs::create_directory(partial);
  });
  FileInfo info;
  on_every_rank(world, "checkpoint save", [&] {
    char file[32];
    std::snprintf(file, sizeof file, "rank-%05d.safetensors", rank);
    info = write_shard(partial + "/" + file, blocks, rank, step);
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
  const auto summaries = all_gather_text(world, summary.dump());
  on_every_rank(world, "checkpoint save", [&] {
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

namespace {

struct Read {  // bytes of a file's data to a piece's tensor
  int64_t off = 0, bytes = 0;
  char* dst = nullptr;
  const std::string* key = nullptr;
};

// Makes the pages of [data, data + bytes) present and writable at once (MADV_POPULATE_WRITE, Linux 5.14);
// a no-op where the kernel cannot.
void prefault(void* data, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#endif
}

// Chunk `c` (data bytes [c, c + len)) against the manifest's CRC-32; the error names the tensors it holds.
void check_chunk(const File& f, const FileInfo& info, const char* bytes, int64_t c, int64_t len,
                 const std::vector<Read>& reads, size_t i, size_t j) {
  const uint32_t got = crc32_of(bytes, static_cast<size_t>(len));
  const uint32_t want = info.crc32.at(static_cast<size_t>(c / kChunkBytes));
  if (got == want) return;
  std::string keys;
  for (size_t k = i; k < j; ++k) {
    if (reads[k].off < c + len && reads[k].off + reads[k].bytes > c &&
        keys.find(*reads[k].key) == std::string::npos) {
      keys += str_cat(keys.empty() ? "" : ", ", "'", *reads[k].key, "'");
    }
  }
  throw ValueError(str_cat("checkpoint: ", f.path(), ": data bytes ", c, "..", c + len - 1, " (chunk ",
                           c / kChunkBytes, ") fail their CRC-32 check (", got, ", the manifest says ", want,
                           "): the file is corrupted where it holds ", keys,
                           ". Load an earlier checkpoint."));
}

// Reads `reads` (sorted by off, disjoint) from `f`, in windows of whole 1 MiB chunks, each chunk checked. The
// next window is read (a second thread) while this one is checked and copied out: disk and CPU overlap.
void read_file(File& f, const FileInfo& info, const std::vector<Read>& reads) {
  constexpr int64_t C = kChunkBytes, kWindow = 32 * kChunkBytes;
  const int64_t data_bytes = info.bytes - info.data_offset;
  auto round_up = [&](int64_t x) { return std::min(data_bytes, (x + C - 1) / C * C); };
  struct Window {
    int64_t w0, w1;
    size_t i, j;  // the reads that may meet it
  };
  std::vector<Window> plan;
  int64_t done = 0;  // bytes before this are read
  for (size_t i = 0; i < reads.size();) {
    const int64_t w0 = std::max(reads[i].off, done) / C * C;
    int64_t w1 = std::min(round_up(reads[i].off + reads[i].bytes), w0 + kWindow);
    size_t j = i + 1;
    // every read that starts inside the window meets it; one starting in the next chunk widens it (to the
    // window's limit)
    for (; j < reads.size(); ++j) {
      if (reads[j].off >= w1 && !(reads[j].off < w1 + C && w1 - w0 < kWindow)) break;
      w1 = std::max(w1, std::min(round_up(reads[j].off + reads[j].bytes), w0 + kWindow));
    }
    plan.push_back({w0, w1, i, j});
    done = w1;
    size_t next = j;  // the first read that goes on past this window
    for (size_t k = i; k < j; ++k) {
      if (reads[k].off + reads[k].bytes > w1) {
        next = k;
        break;
      }
    }
    i = next;
  }
  std::vector<char> buffers[2];
  auto fetch = [&](size_t w) {
    std::vector<char>& buf = buffers[w % 2];
    buf.resize(static_cast<size_t>(plan[w].w1 - plan[w].w0));
    f.read_at(info.data_offset + plan[w].w0, buf.data(), buf.size());
  };
  std::future<void> pending = std::async(std::launch::async, fetch, 0);
  for (size_t w = 0; w < plan.size(); ++w) {
    pending.get();
    if (w + 1 < plan.size()) pending = std::async(std::launch::async, fetch, w + 1);
    const auto [w0, w1, i, j] = plan[w];
    const std::vector<char>& buf = buffers[w % 2];
    // chunk by chunk: checked, then copied out while it is still in the cache
    size_t k = i;
    for (int64_t c = w0; c < w1; c += C) {
      const int64_t len = std::min(C, w1 - c);
      if (!info.crc32.empty()) check_chunk(f, info, buf.data() + (c - w0), c, len, reads, i, j);
      while (k < j && reads[k].off + reads[k].bytes <= c) ++k;
      for (size_t q = k; q < j && reads[q].off < c + len; ++q) {
        const Read& r = reads[q];
        const int64_t a = std::max(r.off, c), b = std::min(r.off + r.bytes, c + len);
        if (b > a && r.dst != nullptr) {
          std::memcpy(r.dst + (a - r.off), buf.data() + (a - w0), static_cast<size_t>(b - a));
        }
      }
    }
  }
}

// The bytes before the data (the safetensors header) against the manifest's checksum of them.
void check_header(File& f, const FileInfo& info) {
  if (info.header_crc32 < 0) return;
  std::string head(static_cast<size_t>(info.data_offset), '\0');
  f.read_at(0, head.data(), head.size());
  const uint32_t got = crc32_of(head.data(), head.size());
  if (got != static_cast<uint32_t>(info.header_crc32)) {
    throw ValueError(str_cat("checkpoint: ", f.path(), ": its safetensors header (bytes 0..",
                             info.data_offset - 1, ") fails its CRC-32 check (", got, ", the manifest says ",
                             info.header_crc32, "): the file is corrupted. Load an earlier checkpoint."));
  }
}

}  // namespace

std::vector<at::Tensor> read_pieces(const std::string& step_dir, const Manifest& m,
                                    const std::vector<Piece>& pieces) {
  std::vector<at::Tensor> out(pieces.size());
  std::vector<std::vector<Read>> by_file(m.files.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    auto it = m.tensors.find(p.key);
    if (it == m.tensors.end()) {
      if (p.optional) continue;
      throw ValueError(str_cat("checkpoint: ", step_dir, " holds no tensor '", p.key,
                               "', which this model needs. Its tensors must be the same as the model's: load "
                               "a checkpoint of this model."));
    }
    const TensorInfo& t = it->second;
    if (t.shape != p.region.shape) {
      throw ValueError(str_cat("checkpoint: tensor '", p.key, "' has shape ", at::IntArrayRef(t.shape),
                               " in ", step_dir, " but ", at::IntArrayRef(p.region.shape),
                               " in this model. Load a checkpoint of a model of the same configuration."));
    }
    const at::ScalarType dtype = scalar_type(t.dtype);
    if (!p.any_dtype && dtype != p.data.scalar_type()) {
      throw ValueError(str_cat("checkpoint: tensor '", p.key, "' is ", t.dtype, " in ", step_dir, " but ",
                               dtype_name(p.data.scalar_type()), " in this run."));
    }
    p.region.validate(str_cat("checkpoint: piece '", p.key, "'"));
    out[i] = at::empty({p.region.count}, at::TensorOptions().dtype(dtype));
    const int64_t elem = static_cast<int64_t>(out[i].element_size());
    const std::vector<Run> want = runs_of(p.region);
    if (want.empty()) continue;
    const int64_t lo = want.front().global, hi = want.back().global + want.back().length;
    int64_t covered = 0;
    for (const auto& b : t.blocks) {
      const std::vector<Run> have = runs_of(b.region);
      if (have.empty() || have.back().global + have.back().length <= lo || have.front().global >= hi)
        continue;
      for (const Copy& c : overlap(have, want)) {
        by_file[static_cast<size_t>(b.file)].push_back({b.offset + c.src * elem, c.length * elem,
                                                        static_cast<char*>(out[i].data_ptr()) + c.dst * elem,
                                                        &it->first});
        covered += c.length;
      }
    }
    if (covered != p.region.count) {
      throw ValueError(str_cat("checkpoint: tensor '", p.key, "' in ", step_dir, ": its blocks hold ",
                               covered, " of the ", p.region.count, " elements this rank needs (",
                               p.region.to_string(), "). The manifest is damaged."));
    }
  }
  // the new tensors' pages made in bulk on another thread while the first windows are read (else one page
  // fault per 4 KiB on the copying thread: most of a load's CPU time)
  std::future<void> populated = std::async(std::launch::async, [&out] {
    for (const auto& t : out) {
      if (t.defined() && t.nbytes() >= static_cast<size_t>(kChunkBytes)) prefault(t.data_ptr(), t.nbytes());
    }
  });
  for (size_t k = 0; k < m.files.size(); ++k) {
    auto& reads = by_file[k];
    if (reads.empty()) continue;
    const std::string path = step_dir + "/" + m.files[k].name;
    if (!fs::exists(path)) {
      throw ValueError(str_cat("checkpoint: shard file ", path,
                               ", which the manifest names, is missing. Load an "
                               "earlier checkpoint, or copy the whole folder again."));
    }
    File f(path, File::Mode::kRead);
    if (f.size() != m.files[k].bytes) {
      throw ValueError(str_cat("checkpoint: ", path, " has ", f.size(), " bytes; the manifest says ",
                               m.files[k].bytes, " (", f.size() < m.files[k].bytes ? "truncated" : "grown",
                               "). Load an earlier checkpoint."));
    }
    check_header(f, m.files[k]);
    std::sort(reads.begin(), reads.end(), [](const Read& a, const Read& b) { return a.off < b.off; });
    read_file(f, m.files[k], reads);
  }
  return out;
}

std::vector<at::Tensor> load(const std::string& step_dir, const std::vector<Piece>& pieces,
                             const comm::BackendPtr& world,
                             const std::function<void(const Manifest&)>& check) {
  std::vector<at::Tensor> out;
  on_every_rank(world, "checkpoint load", [&] {
    const Manifest m = read_manifest(step_dir);
    if (check) check(m);
    out = read_pieces(step_dir, m, pieces);
  });
  return out;
}

void verify_files(const std::string& step_dir, const Manifest& m) {
  for (const auto& info : m.files) {
    const std::string path = step_dir + "/" + info.name;
    File f(path, File::Mode::kRead);
    if (f.size() != info.bytes) {
      throw ValueError(
          str_cat("checkpoint: ", path, " has ", f.size(), " bytes; the manifest says ", info.bytes, "."));
    }
    check_header(f, info);
    const std::vector<Read> all{
        {0, info.bytes - info.data_offset, nullptr, &info.name}};  // (checked, not kept)
    if (all[0].bytes > 0) read_file(f, info, all);
    const SafetensorsHeader h = read_header(path);  // the header itself parses and matches
    if (h.data_offset != info.data_offset) {
      throw ValueError(str_cat("checkpoint: ", path, ": its header ends at byte ", h.data_offset,
                               "; the manifest says ", info.data_offset, "."));
    }
  }
}

}  // namespace dtrain::checkpoint
