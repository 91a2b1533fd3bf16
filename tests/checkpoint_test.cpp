// Checkpoint arithmetic and files in one process (pure tier, and a one-rank world for save/load): regions
// against brute force, every layout pair resharded exactly, the safetensors header and the manifest fuzzed,
// and each kind of damaged file rejected with a message naming it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <torch/optim/adamw.h>
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/region.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"
#include "comm/factory.h"
#include "core/error.h"
#include "models/gpt.h"
#include "parallel/parallelize.h"

using namespace dtrain;
using namespace dtrain::checkpoint;
namespace fs = std::filesystem;

namespace {

// The region's global indices in its storage order, the slow obvious way.
std::vector<int64_t> brute_indices(const Region& r) {
  const size_t d = r.shape.size();
  std::vector<int64_t> out, idx(d, 0);
  const int64_t n = r.box_numel();
  for (int64_t k = 0; k < n; ++k) {
    int64_t rest = k, g = 0, stride = 1;
    for (size_t i = d; i-- > 0;) {
      idx[i] = rest % r.box_sizes[i];
      rest /= r.box_sizes[i];
    }
    for (size_t i = d; i-- > 0;) {
      g += (r.box_offset[i] + idx[i]) * stride;
      stride *= r.shape[i];
    }
    if (k >= r.begin && k < r.begin + r.count) out.push_back(g);
  }
  return out;
}

std::vector<int64_t> expand(const std::vector<Run>& runs) {
  std::vector<int64_t> out;
  for (const Run& r : runs) {
    EXPECT_EQ(r.local, static_cast<int64_t>(out.size()));
    for (int64_t i = 0; i < r.length; ++i) out.push_back(r.global + i);
  }
  return out;
}

Region random_region(std::mt19937& rng) {
  std::uniform_int_distribution<int> dims(0, 3), size(0, 5);
  Region r;
  const int d = dims(rng);
  for (int i = 0; i < d; ++i) {
    const int64_t s = size(rng);
    const int64_t off = s == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, s - 1)(rng);
    const int64_t len = s == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, s - off)(rng);
    r.shape.push_back(s);
    r.box_offset.push_back(off);
    r.box_sizes.push_back(len);
  }
  const int64_t n = r.box_numel();
  r.begin = std::uniform_int_distribution<int64_t>(0, n)(rng);
  r.count = std::uniform_int_distribution<int64_t>(0, n - r.begin)(rng);
  return r;
}

// Layouts of a [rows, cols] tensor, each a list of per-rank regions: whole (replicated), rows or columns
// split over 2-4 ranks (uneven), flat ZeRO shards of the whole, and flat shards of a column split.
std::vector<std::vector<Region>> layouts(int64_t rows, int64_t cols) {
  std::vector<std::vector<Region>> out;
  const Region whole = Region::whole({rows, cols});
  for (int n = 1; n <= 4; ++n) {
    std::vector<Region> by_rows, by_cols, flat, flat_of_cols;
    for (int r = 0; r < n; ++r) {
      Region a = whole;
      a.box_offset[0] = rows * r / n;
      a.box_sizes[0] = rows * (r + 1) / n - rows * r / n;
      a.count = a.box_numel();
      by_rows.push_back(a);
      Region b = whole;
      b.box_offset[1] = cols * r / n;
      b.box_sizes[1] = cols * (r + 1) / n - cols * r / n;
      b.count = b.box_numel();
      by_cols.push_back(b);
      flat.push_back(split(whole, n, r));
    }
    for (int c = 0; c < 2; ++c) {  // tp 2 x zero over n
      Region b = whole;
      b.box_offset[1] = cols * c / 2;
      b.box_sizes[1] = cols * (c + 1) / 2 - cols * c / 2;
      b.count = b.box_numel();
      for (int r = 0; r < n; ++r) flat_of_cols.push_back(split(b, n, r));
    }
    out.push_back(by_rows);
    out.push_back(by_cols);
    out.push_back(flat);
    out.push_back(flat_of_cols);
  }
  return out;
}

std::string temp_dir(const std::string& name) {
  const std::string d =
      str_cat(fs::temp_directory_path().string(), "/dtrain_ckpt_test_", ::getpid(), "_", name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

comm::BackendPtr one_rank() {
  static comm::BackendPtr world = comm::create_backend("gloo", RankInfo{}, std::chrono::seconds(30));
  return world;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Region, RunsMatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const Region r = random_region(rng);
    r.validate("random");
    EXPECT_EQ(expand(runs_of(r)), brute_indices(r)) << r.to_string();
  }
}

TEST(Region, OverlapMatchesBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    Region a = random_region(rng), b = random_region(rng);
    b.shape = a.shape;  // (b's box may not fit a's shape: redraw it inside)
    b.box_offset.assign(a.shape.size(), 0);
    b.box_sizes.assign(a.shape.size(), 0);
    for (size_t i = 0; i < a.shape.size(); ++i) {
      const int64_t s = a.shape[i];
      b.box_offset[i] = s == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, s - 1)(rng);
      b.box_sizes[i] = s == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, s - b.box_offset[i])(rng);
    }
    b.begin = 0;
    b.count = b.box_numel();
    std::map<int64_t, int64_t> pos_b;
    const auto ib = brute_indices(b);
    for (size_t k = 0; k < ib.size(); ++k) pos_b[ib[k]] = static_cast<int64_t>(k);
    std::vector<std::pair<int64_t, int64_t>> want, got;
    const auto ia = brute_indices(a);
    for (size_t k = 0; k < ia.size(); ++k) {
      if (pos_b.count(ia[k])) want.emplace_back(static_cast<int64_t>(k), pos_b[ia[k]]);
    }
    for (const Copy& c : overlap(runs_of(a), runs_of(b))) {
      for (int64_t i = 0; i < c.length; ++i) got.emplace_back(c.src + i, c.dst + i);
    }
    EXPECT_EQ(got, want) << a.to_string() << " -> " << b.to_string();
  }
}

TEST(Region, SplitCoversTheRangeEvenly) {
  const Region w = Region::whole({5, 7});
  for (int64_t parts = 1; parts <= 6; ++parts) {
    int64_t at = 0;
    for (int64_t i = 0; i < parts; ++i) {
      const Region s = split(w, parts, i);
      EXPECT_EQ(s.begin, at);
      EXPECT_TRUE(s.count == 35 / parts || s.count == 35 / parts + 1);
      at += s.count;
    }
    EXPECT_EQ(at, 35);
  }
}

TEST(Region, BadRegionsAreRejectedWithTheirValues) {
  Region r = Region::whole({4, 3});
  r.box_offset[1] = 2;
  EXPECT_NE(message_of([&] { r.validate("t"); }).find("leaves the tensor's shape [4, 3] on dim 1"),
            std::string::npos);
  r = Region::whole({4, 3});
  r.count = 13;
  EXPECT_NE(message_of([&] { r.validate("t"); }).find("elements 0..13 leave the box of 12"),
            std::string::npos);
}

// Every layout pair: the target's pieces filled from the saved layout's blocks equal the global tensor.
TEST(Region, EveryLayoutPairReshardsExactly) {
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{7, 5}, {4, 6}, {1, 3}, {3, 1}}) {
    const at::Tensor global = at::arange(rows * cols, at::kFloat);
    for (const auto& from : layouts(rows, cols)) {
      for (const auto& to : layouts(rows, cols)) {
        for (const Region& want : to) {
          at::Tensor got = at::full({want.count}, -1.0f);
          const auto want_runs = runs_of(want);
          for (const Region& have : from) {
            at::Tensor block = global.index({at::tensor(brute_indices(have), at::kLong)});
            for (const Copy& c : overlap(runs_of(have), want_runs)) {
              got.narrow(0, c.dst, c.length).copy_(block.narrow(0, c.src, c.length));
            }
          }
          const at::Tensor expect = global.index({at::tensor(brute_indices(want), at::kLong)});
          ASSERT_TRUE(at::equal(got, expect)) << want.to_string();
        }
      }
    }
  }
}

TEST(Safetensors, HeaderRoundTripsAndFuzzedHeadersAreRejectedCleanly) {
  const std::vector<SafetensorsEntry> entries{
      {"a", "F32", {2, 3}, 0, 24}, {"b.c", "BF16", {5}, 24, 34}, {"d", "U8", {0}, 34, 34}};
  const std::string header = encode_header(entries, {{"format", "pt"}});
  ASSERT_EQ(header.size() % 8, 0u);
  const int64_t len = static_cast<int64_t>(header.size()) - 8;
  const int64_t file_bytes = static_cast<int64_t>(header.size()) + 34;
  const SafetensorsHeader h = decode_header("f", header.substr(8), len, file_bytes);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.find("b.c")->shape, std::vector<int64_t>{5});
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_offset, static_cast<int64_t>(header.size()));
  // a file one byte longer or shorter than its tensors
  EXPECT_NE(message_of([&] { decode_header("f", header.substr(8), len, file_bytes + 1); }).find("trailing"),
            std::string::npos);
  std::mt19937 rng(3);
  int rejected = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::string body = header.substr(8);
    const int flips = 1 + trial % 3;
    for (int f = 0; f < flips; ++f) {
      body[std::uniform_int_distribution<size_t>(0, body.size() - 1)(rng)] =
          static_cast<char>(std::uniform_int_distribution<int>(32, 126)(rng));
    }
    if (trial % 5 == 0) body.resize(std::uniform_int_distribution<size_t>(0, body.size())(rng));
    try {
      const SafetensorsHeader g = decode_header("fuzz", body, static_cast<int64_t>(body.size()),
                                                static_cast<int64_t>(body.size()) + 8 + 34);
      int64_t at = 0;  // accepted: then it is consistent
      for (const auto& e : g.tensors) {
        ASSERT_EQ(e.begin, at);
        at = e.end;
      }
      ASSERT_EQ(at, 34);
    } catch (const ValueError& e) {
      ++rejected;
      EXPECT_NE(std::string(e.what()).find("fuzz"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(rejected, 3000);
}

TEST(Manifest, RoundTripsAndFuzzedManifestsAreRejectedCleanly) {
  Manifest m;
  m.step = 12;
  m.world_size = 2;
  m.files = {{"rank-00000.safetensors", 8 + 16 + 40, 24, {0x1234u}, 77},
             {"rank-00001.safetensors", 8 + 16 + 8, 24, {9u}, 5}};
  TensorInfo t;
  t.dtype = "F32";
  t.shape = {4, 3};
  Region r0 = Region::whole({4, 3}), r1 = r0;
  r0.count = 10;
  r1.begin = 10;
  r1.count = 2;
  t.blocks = {{0, 0, r0}, {1, 0, r1}};
  m.tensors["model/w"] = t;
  const std::string text = m.to_json();
  const Manifest back = Manifest::parse("m.json", text);
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.tensors.at("model/w").blocks.at(1).region, r1);
  EXPECT_EQ(back.files.at(0).crc32, std::vector<uint32_t>{0x1234u});
  std::mt19937 rng(5);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s = text;
    for (int f = 0; f < 1 + trial % 3; ++f) {
      s[std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng)] =
          static_cast<char>(std::uniform_int_distribution<int>(32, 126)(rng));
    }
    try {
      const Manifest g = Manifest::parse("fuzz.json", s);
      for (const auto& [key, ti] : g.tensors) {  // accepted: every block inside its tensor and file
        int64_t held = 0;
        for (const auto& b : ti.blocks) {
          b.region.validate("accepted");
          held += b.region.count;
        }
        int64_t numel = 1;
        for (int64_t d : ti.shape) numel *= d;
        ASSERT_EQ(held, numel);
      }
    } catch (const ValueError& e) {
      ++rejected;
      EXPECT_NE(std::string(e.what()).find("fuzz.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);
  // named failures
  Manifest newer = m;
  newer.version = 2;
  EXPECT_NE(message_of([&] { Manifest::parse("m.json", newer.to_json()); }).find("format version 2, newer"),
            std::string::npos);
  Manifest gap = m;
  gap.tensors["model/w"].blocks[1].region.begin = 11;
  gap.tensors["model/w"].blocks[1].region.count = 1;
  EXPECT_NE(message_of([&] {
              Manifest::parse("m.json", gap.to_json());
            }).find("tensor 'model/w': its blocks leave a gap at element 10"),
            std::string::npos);
  Manifest outside = m;
  outside.tensors["model/w"].blocks[1].offset = 4;  // 8 bytes at 4 of file 1's 8
  EXPECT_NE(message_of([&] {
              Manifest::parse("m.json", outside.to_json());
            }).find("leaves file 'rank-00001.safetensors'"),
            std::string::npos);
}

// Save and load on a one-rank world, then each kind of damage: the message names the file and what is wrong.
TEST(Checkpoint, DamagedFilesAreRejectedNamingTheFile) {
  const std::string root = temp_dir("damage");
  auto world = one_rank();
  const at::Tensor w = at::arange(3 * 1000 * 1000, at::kFloat).reshape({3000, 1000}) / 7;  // 12 MB: 12 chunks
  const at::Tensor b = at::arange(5, at::kDouble);
  auto pieces = [&](const at::Tensor& wv, const at::Tensor& bv) {
    return std::vector<Piece>{{"model/w", wv.reshape({-1}), Region::whole({3000, 1000}), "whole"},
                              {"model/b", bv, Region::whole({5}), "whole"}};
  };
  const std::string dir = save(root, 3, pieces(w, b), world, {});
  EXPECT_EQ(resolve(root), dir);
  // a reshard on load: rows 1000..1999 only
  Region rows = Region::whole({3000, 1000});
  rows.box_offset[0] = 1000;
  rows.box_sizes[0] = 1000;
  rows.count = rows.box_numel();
  auto got =
      load(dir, {{"model/w", at::empty({0}), rows, ""}, {"model/b", b, Region::whole({5}), ""}}, world);
  EXPECT_TRUE(at::equal(got[0], w.narrow(0, 1000, 1000).reshape({-1})));
  EXPECT_TRUE(at::equal(got[1], b));
  const auto want = pieces(w, b);
  auto damaged = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string copy = temp_dir(name);
    fs::copy(dir, copy, fs::copy_options::recursive);
    damage(copy);
    return message_of([&] { load(copy, want, world); });
  };
  const std::string file = "rank-00000.safetensors";
  auto flip = [&](const std::string& d, int64_t offset) {
    std::fstream f(d + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(offset);
    f.write(&c, 1);
  };
  std::string m = damaged("flip", [&](const std::string& d) { flip(d, fs::file_size(d + "/" + file) / 2); });
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find("fail their CRC-32 check"), std::string::npos) << m;
  EXPECT_NE(m.find("'model/w'"), std::string::npos) << m;
  m = damaged("header", [&](const std::string& d) { flip(d, 20); });
  EXPECT_NE(m.find("safetensors header"), std::string::npos) << m;
  m = damaged("truncated", [&](const std::string& d) {
    fs::resize_file(d + "/" + file, fs::file_size(d + "/" + file) - 100);
  });
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  EXPECT_NE(m.find(file), std::string::npos) << m;
  m = damaged("missing", [&](const std::string& d) { fs::remove(d + "/" + file); });
  EXPECT_NE(m.find("is missing"), std::string::npos) << m;
  m = damaged("manifest",
              [&](const std::string& d) { std::ofstream(d + "/manifest.json", std::ios::app) << "}"; });
  EXPECT_NE(m.find("manifest.json: not a JSON object"), std::string::npos) << m;
  // the model's expectations: a name and a shape that differ
  m = message_of([&] { load(dir, {{"model/x", b, Region::whole({5}), ""}}, world); });
  EXPECT_NE(m.find("holds no tensor 'model/x'"), std::string::npos) << m;
  m = message_of([&] { load(dir, {{"model/b", b, Region::whole({6}), ""}}, world); });
  EXPECT_NE(m.find("tensor 'model/b' has shape [5]"), std::string::npos) << m;
  EXPECT_NE(m.find("[6] in this model"), std::string::npos) << m;
  fs::remove_all(root);
}

// More data than one read window (32 MiB) in many small tensors and a few large ones: every element comes
// back, whole and resharded.
// Saves `saved` under `root` at one rank, loads `wanted` (regions of the same keys) and compares each with
// the saved tensor's part.
void expect_round_trip(const std::string& root, const std::vector<Piece>& saved,
                       const std::vector<Piece>& wanted) {
  auto world = one_rank();
  const std::string dir = save(root, 1, saved, world, {});
  const auto got = load(dir, wanted, world);
  for (size_t i = 0; i < saved.size(); ++i) {
    const at::Tensor expect = saved[i].data.narrow(0, wanted[i].region.begin, wanted[i].region.count);
    ASSERT_TRUE(at::equal(got[i], expect)) << wanted[i].key;
  }
  fs::remove_all(root);
}

TEST(Checkpoint, ManyTensorsAcrossReadWindowsComeBackExactly) {
  std::vector<Piece> saved, wanted;
  for (int i = 0; i < 1500; ++i) {  // 1500 x 12000 floats (72 MB), and 3 x 6 MB between them
    const int64_t n = i % 500 == 7 ? 1500000 : 12000;
    const at::Tensor t = at::arange(n, at::kFloat) + static_cast<double>(i) * 1e4;
    saved.push_back({str_cat("model/t", i), t, Region::whole({n}), ""});
    Region half = Region::whole({n});
    half.begin = n / 3;
    half.count = n / 2;
    wanted.push_back({str_cat("model/t", i), t, i % 2 ? Region::whole({n}) : half, ""});
  }
  expect_round_trip(temp_dir("windows"), saved, wanted);
}

// Tiny tensors put thousands of destinations (and the gaps between the halves wanted) in one read window:
// more than one scattered read (IOV_MAX) takes, so the window is read in several.
TEST(Checkpoint, ThousandsOfTinyTensorsInOneWindowComeBackExactly) {
  std::vector<Piece> saved, wanted;
  for (int i = 0; i < 3000; ++i) {
    const int64_t n = 5 + i % 13;
    const at::Tensor t = at::arange(n, at::kFloat) + static_cast<double>(i) * 100;
    saved.push_back({str_cat("model/t", i), t, Region::whole({n}), ""});
    Region part = Region::whole({n});
    part.begin = i % 3;
    part.count = n - 2 * (i % 3);
    wanted.push_back({str_cat("model/t", i), t, part, ""});
  }
  expect_round_trip(temp_dir("tiny"), saved, wanted);
}

TEST(FileIo, ScatteredReadsMatchOneReadAndCrcsExtend) {
  const std::string root = temp_dir("scatter");
  const std::string path = root + "/f";
  std::string bytes(300000, '\0');
  std::mt19937 gen(7);
  for (auto& c : bytes) c = static_cast<char>(gen());
  {
    File f(path, File::Mode::kCreate);
    f.write(bytes.data(), bytes.size());
    f.close();
  }
  File f(path, File::Mode::kRead);
  std::string whole(bytes.size() - 10, '\0');
  f.read_at(10, whole.data(), whole.size());
  EXPECT_EQ(whole, bytes.substr(10));
  // 3000 pieces (more than IOV_MAX), some empty, of uneven sizes, from byte 10 on
  std::string scattered(whole.size(), '\0');
  std::vector<File::Piece> pieces;
  size_t at = 0;
  for (int k = 0; at < scattered.size(); ++k) {
    const size_t n = std::min<size_t>(k % 7 == 0 ? 0 : static_cast<size_t>(k % 211), scattered.size() - at);
    pieces.push_back({scattered.data() + at, n});
    at += n;
  }
  ASSERT_GT(pieces.size(), 1024u);
  f.read_scattered(10, pieces);
  EXPECT_EQ(scattered, whole);
  // past the end: the truncation message
  std::string more(100, '\0');
  try {
    f.read_scattered(static_cast<int64_t>(bytes.size()) - 40, {{more.data(), 50}, {more.data() + 50, 50}});
    ADD_FAILURE() << "a read past the end succeeded";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(str_cat("ends at byte ", bytes.size(), ", 60 bytes short")),
              std::string::npos)
        << e.what();
  }
  // a CRC extended piece by piece is the CRC of the whole
  uint32_t crc = 0;
  for (size_t a = 0; a < bytes.size(); a += 777)
    crc = crc32_extend(crc, bytes.data() + a, std::min<size_t>(777, bytes.size() - a));
  EXPECT_EQ(crc, crc32_of(bytes.data(), bytes.size()));
  EXPECT_NE(crc, crc32_of(bytes.data(), bytes.size() - 1));
  fs::remove_all(root);
}

TEST(Checkpoint, LatestMovesLastAndKeepPrunesTheOldest) {
  const std::string root = temp_dir("keep");
  auto world = one_rank();
  const at::Tensor v = at::arange(10, at::kFloat);
  for (int64_t step : {1, 2, 3, 4}) {
    SaveOptions o;
    o.keep = 2;
    save(root, step, {{"model/v", v + static_cast<double>(step), Region::whole({10}), ""}}, world, o);
    EXPECT_EQ(resolve(root), root + str_cat("/step-0000000", step));
  }
  EXPECT_FALSE(fs::exists(root + "/step-00000002"));
  EXPECT_TRUE(fs::exists(root + "/step-00000003"));
  // saving a step again replaces it whole
  save(root, 4, {{"model/v", v * 0, Region::whole({10}), ""}}, world, {});
  auto got = load(resolve(root), {{"model/v", v, Region::whole({10}), ""}}, world);
  EXPECT_TRUE(at::equal(got[0], v * 0));
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos);
  fs::remove_all(root);
}

// A load that fails (a flipped byte) changes nothing: the parameters and the optimizer's state are those
// before it, and an optimizer that had no state still has none.
TEST(TrainingState, AFailedLoadChangesNothing) {
  auto world = one_rank();
  const parallel::OptimizerFactory adamw =
      [](std::vector<at::Tensor> t) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(t, torch::optim::AdamWOptions(1e-2));
  };
  models::GPTConfig cfg{64, 8, 1, 2, 16};
  models::GPT gpt(cfg);
  auto par = parallel::parallelize(*gpt, world, parallel::ParallelConfig{}, adamw);
  TrainingState state(*gpt, *par, nullptr);
  const at::Tensor x = at::arange(18, at::kLong).reshape({2, 9}) % 64;
  auto step = [&] {
    par->zero_grad();
    gpt->loss(x.narrow(1, 0, 8).contiguous(), x.narrow(1, 1, 8).contiguous()).backward();
    par->step();
  };
  step();
  const std::string root = temp_dir("failed");
  const std::string dir = state.save(root, 1);
  step();  // the run goes on: its state is no longer the checkpoint's
  auto snapshot = [&] {
    std::vector<at::Tensor> out;
    for (const auto& p : gpt->parameters()) out.push_back(p.detach().clone());
    for (const auto& [key, s] : par->optimizer().state()) {
      auto& a = static_cast<torch::optim::AdamWParamState&>(*s);
      out.push_back(a.exp_avg().clone());
      out.push_back(at::full({1}, a.step(), at::kLong));
    }
    return out;
  };
  const auto before = snapshot();
  {
    std::fstream f(dir + "/rank-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THROW(state.load(root), ValueError);
  const auto after = snapshot();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << i;
  // a fresh run: no optimizer state before, none after
  models::GPT fresh(cfg);
  auto par2 = parallel::parallelize(*fresh, world, parallel::ParallelConfig{}, adamw);
  TrainingState state2(*fresh, *par2, nullptr);
  EXPECT_THROW(state2.load(root), ValueError);
  EXPECT_EQ(par2->optimizer().state().size(), 0u);
  fs::remove_all(root);
}
