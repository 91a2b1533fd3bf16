// Text corpus and batches; see text_data.h.
#include "apps/dtrain/gpt/text_data.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace dtrain::train {

namespace fs = std::filesystem;

TextCorpus load_text(const std::string& path, double val_fraction) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw ValueError(
        str_cat("data: '", path, "' does not exist. Pass a text file or a folder of text files (",
                "the default, /usr/share/games/fortunes, comes with the Debian package fortunes)."));
  }
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      auto ext = e.path().extension().string();
      if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  // Regular files only (a device such as /dev/zero never ends), and a corpus that fits this loader.
  constexpr uintmax_t kMaxBytes = uintmax_t{1} << 31;
  uintmax_t total = 0;
  for (const auto& f : files) {
    if (!fs::is_regular_file(f, ec)) {
      throw ValueError(str_cat("data: '", f.string(), "' is not a regular file (a device, socket or pipe). ",
                               "Pass a text file or a folder of text files."));
    }
    total += fs::file_size(f, ec);
  }
  if (total > kMaxBytes) {
    throw ValueError(str_cat("data: '", path, "' holds ", total, " bytes; this loader reads at most ",
                             kMaxBytes, " (2 GiB) into memory. Pass a smaller file or folder."));
  }
  std::vector<uint8_t> bytes;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (bytes.size() < 4096) {
    throw ValueError(str_cat("data: '", path, "' holds ", bytes.size(),
                             " bytes of text; at least 4096 are needed. Point --data at more text."));
  }
  at::Tensor all = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte);
  const int64_t n_val = std::max<int64_t>(1024, static_cast<int64_t>(val_fraction * all.numel()));
  TextCorpus c;
  c.source =
      str_cat(path, " (", files.size(), " file", files.size() == 1 ? "" : "s", ", ", bytes.size(), " bytes)");
  c.train = all.narrow(0, 0, all.numel() - n_val).clone();
  c.val = all.narrow(0, all.numel() - n_val, n_val).clone();
  return c;
}

int64_t window_count(const at::Tensor& tokens, int64_t seq) {
  const int64_t n = (tokens.numel() - 1) / seq;
  if (n < 1) {
    throw ValueError(str_cat("data: ", tokens.numel(), " tokens are fewer than one window of ", seq + 1,
                             ". Lower --seq or use more text."));
  }
  return n;
}

at::Tensor windows(const at::Tensor& tokens, int64_t seq, const at::Tensor& indices) {
  const at::Tensor idx = (indices.unsqueeze(1) * seq + at::arange(seq + 1, at::kLong)).reshape({-1});
  return at::index_select(tokens, 0, idx).to(at::kLong).view({indices.numel(), seq + 1});
}

}  // namespace dtrain::train
