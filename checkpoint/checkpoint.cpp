// Sharded save and load; see checkpoint.h.
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
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

// Chunk `c` (data bytes [c, c + len)), whose CRC-32 is `got`, against the manifest's; the error names the
// tensors it holds.
void check_chunk(const File& f, const FileInfo& info, uint32_t got, int64_t c, int64_t len,
                 const std::vector<Read>& reads, size_t i, size_t j) {
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

// Reads `reads` (sorted by off, disjoint) from `f`, in windows of whole 1 MiB chunks, each chunk checked. One
// reader thread reads the windows in order, each with one scattered read straight into the destinations (the
// bytes no read wants into a scratch buffer), while this thread checks the windows before: the data is copied
// once (by the kernel, from its page cache) and the disk never waits for the CPU. Small windows (4 MiB) keep
// the kernel's readahead streaming (one 32 MiB read per call ran 20-30% below dd here) and the first wait
// short. `first_in` (if any) is called once the first window is in.
void read_file(File& f, const FileInfo& info, const std::vector<Read>& reads,
               const std::function<void()>& first_in = {}) {
  constexpr int64_t C = kChunkBytes, kWindow = 4 * kChunkBytes;
  constexpr size_t kRing = 4;  // windows read ahead of the check
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
  if (plan.empty()) return;
  struct Segment {  // bytes [off, off + len) of the data, at p
    int64_t off, len;
    char* p;
  };
  std::vector<Segment> segments[kRing];
  std::vector<char> scratch[kRing];
  std::mutex mu;
  std::condition_variable cv;
  size_t produced = 0, consumed = 0;  // windows read; windows checked (their slots free again)
  bool stop = false;
  std::exception_ptr failed;
  std::thread reader([&] {
    try {
      for (size_t w = 0; w < plan.size(); ++w) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || w - consumed < kRing; });
          if (stop) return;
        }
        const Window& win = plan[w];
        std::vector<Segment>& seg = segments[w % kRing];
        seg.clear();
        int64_t at = win.w0;
        bool gaps = false;
        for (size_t q = win.i; q < win.j; ++q) {
          const Read& r = reads[q];
          const int64_t a = std::max(r.off, win.w0), b = std::min(r.off + r.bytes, win.w1);
          if (b <= a) continue;
          if (a > at) seg.push_back({at, a - at, nullptr}), gaps = true;
          seg.push_back({a, b - a, r.dst == nullptr ? nullptr : r.dst + (a - r.off)});
          gaps = gaps || r.dst == nullptr;
          at = b;
        }
        if (at < win.w1) seg.push_back({at, win.w1 - at, nullptr}), gaps = true;
        if (gaps) scratch[w % kRing].resize(static_cast<size_t>(win.w1 - win.w0));
        std::vector<File::Piece> pieces;
        pieces.reserve(seg.size());
        for (auto& g : seg) {
          if (g.p == nullptr) g.p = scratch[w % kRing].data() + (g.off - win.w0);
          pieces.push_back({g.p, static_cast<size_t>(g.len)});
        }
        f.read_scattered(info.data_offset + win.w0, std::move(pieces));
        {
          std::lock_guard<std::mutex> lock(mu);
          produced = w + 1;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      failed = std::current_exception();
      cv.notify_all();
    }
  });
  struct Joiner {  // the reader stops and is joined however this function leaves
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::thread& t;
    ~Joiner() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      t.join();
    }
  } joiner{mu, cv, stop, reader};
  for (size_t w = 0; w < plan.size(); ++w) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return produced > w || failed; });
      if (produced <= w) std::rethrow_exception(failed);
    }
    if (w == 0 && first_in) first_in();
    const Window& win = plan[w];
    if (!info.crc32.empty()) {
      const std::vector<Segment>& seg = segments[w % kRing];
      size_t g = 0;
      for (int64_t c = win.w0; c < win.w1; c += C) {
        const int64_t len = std::min(C, win.w1 - c);
        uint32_t crc = 0;
        for (; g < seg.size() && seg[g].off < c + len; ++g) {
          const int64_t a = std::max(seg[g].off, c), b = std::min(seg[g].off + seg[g].len, c + len);
          crc = crc32_extend(crc, seg[g].p + (a - seg[g].off), static_cast<size_t>(b - a));
          if (seg[g].off + seg[g].len > c + len) break;  // goes on into the next chunk
        }
        check_chunk(f, info, crc, c, len, reads, win.i, win.j);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      consumed = w + 1;
    }
    cv.notify_all();
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
  for (auto& reads : by_file) {
    std::sort(reads.begin(), reads.end(), [](const Read& a, const Read& b) { return a.off < b.off; });
  }
  // The new tensors' pages made in bulk on another thread (else one page fault per 4 KiB in the reads: most
  // of a load's CPU time), from the last read back to the first: the reads fault the first ones themselves,
  // the two meet once. It starts once the first window is in: started with the first read, it slowed that
  // read by 30-50 ms here (both making pages at once).
  std::promise<void> first_in;
  std::future<void> populated =
      std::async(std::launch::async, [&by_file, go = first_in.get_future().share()] {
        go.wait();
        for (size_t k = by_file.size(); k-- > 0;) {
          for (size_t q = by_file[k].size(); q-- > 0;) {
            const Read& r = by_file[k][q];
            if (r.dst != nullptr && r.bytes >= 64 * 1024) prefault(r.dst, static_cast<size_t>(r.bytes));
          }
        }
      });
  bool started = false;
  auto start = [&] {
    if (!started) started = true, first_in.set_value();
  };
  struct Start {  // however this function leaves (before `populated`, which waits for the thread)
    std::function<void()> f;
    ~Start() { f(); }
  } start_anyway{start};
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
    read_file(f, m.files[k], reads, start);
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
