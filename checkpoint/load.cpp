// Sharded load (checkpoint.h): every piece's regions read from the shard files that hold them, each byte
// checked against the manifest's CRC-32 of its chunk on the way; and the full verification of a checkpoint.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "comm/gather_text.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::checkpoint {

namespace fs = std::filesystem;

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
  comm::on_every_rank(world, "checkpoint load", [&] {
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
