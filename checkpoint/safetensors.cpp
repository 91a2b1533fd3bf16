// The safetensors layout; see safetensors.h.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "core/error.h"

namespace dtrain::checkpoint {

namespace {

constexpr int64_t kMaxHeader = int64_t{100} << 20;  // safetensors' own limit

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes{
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U64", 8},  {"U32", 4}, {"U16", 2}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) {
    throw ValueError(
        str_cat("safetensors: dtype '", dtype,
                "' is not one dtrain reads (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)."));
  }
  return it->second;
}

std::string encode_header(const std::vector<SafetensorsEntry>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  int64_t at = 0;
  for (const auto& t : tensors) {
    DTRAIN_ASSERT(t.begin == at && t.end >= t.begin, "safetensors: ranges must follow one another: '", t.name,
                  "' at ", t.begin, ", expected ", at);
    at = t.end;
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string body = j.dump();
  body.append((8 - body.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = body.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + body;
}

SafetensorsHeader decode_header(const std::string& path, const std::string& text, int64_t header_len,
                                int64_t file_bytes) {
  auto bad = [&](const std::string& what) {
    return ValueError(
        str_cat("safetensors: ", path, ": ", what,
                ". The file is damaged or not a safetensors file; load an earlier checkpoint."));
  };
  if (header_len < 2 || header_len > kMaxHeader || header_len > file_bytes - 8) {
    throw bad(str_cat("the header length is ", header_len, " bytes (the file has ", file_bytes,
                      "; at most 100 MB)"));
  }
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw bad("the header is not a JSON object");
  SafetensorsHeader h;
  h.data_offset = 8 + header_len;
  h.data_bytes = file_bytes - h.data_offset;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) throw bad(str_cat("__metadata__ '", k, "' is not a string"));
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      throw bad(str_cat("tensor '", name, "' lacks a string dtype, a shape array or two data_offsets"));
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    const int64_t elem = [&] {
      try {
        return dtype_bytes(e.dtype);
      } catch (const ValueError&) {
        throw bad(str_cat("tensor '", name, "' has dtype '", e.dtype, "', which dtrain does not read"));
      }
    }();
    int64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 48)) {
        throw bad(str_cat("tensor '", name, "' has a shape entry ", d.dump(), " that is not a size"));
      }
      e.shape.push_back(d.get<int64_t>());
      numel = std::min<int64_t>(numel * e.shape.back(), int64_t{1} << 50);
    }
    for (int k = 0; k < 2; ++k) {
      if (!v["data_offsets"][k].is_number_unsigned() ||
          v["data_offsets"][k].get<uint64_t>() > static_cast<uint64_t>(h.data_bytes)) {
        throw bad(str_cat("tensor '", name, "' has data_offsets ", v["data_offsets"].dump(),
                          " outside the file's ", h.data_bytes, " bytes of data"));
      }
    }
    e.begin = v["data_offsets"][0].get<int64_t>();
    e.end = v["data_offsets"][1].get<int64_t>();
    if (e.end < e.begin || e.end - e.begin != numel * elem) {
      throw bad(str_cat("tensor '", name, "' has data_offsets [", e.begin, ", ", e.end, "] for ", numel, " ",
                        e.dtype, " elements (", numel * elem, " bytes)"));
    }
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  int64_t at = 0;
  for (const auto& e : h.tensors) {
    if (e.begin != at) {
      throw bad(str_cat("tensor '", e.name, "' starts at data byte ", e.begin, " where the previous ends at ",
                        at, " (a hole or an overlap)"));
    }
    at = e.end;
  }
  if (at != h.data_bytes) {
    throw bad(str_cat("its tensors end at data byte ", at, " but the file holds ", h.data_bytes,
                      " bytes of data (truncated or with trailing bytes)"));
  }
  return h;
}

SafetensorsHeader read_header(const std::string& path) {
  File f(path, File::Mode::kRead);
  const int64_t size = f.size();
  if (size < 8) {
    throw ValueError(str_cat("safetensors: ", path, " has ", size,
                             " bytes, fewer than the 8 of a header's length: it is truncated or empty."));
  }
  unsigned char len[8];
  f.read_at(0, len, 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  const int64_t header_len = n > static_cast<uint64_t>(kMaxHeader) ? kMaxHeader + 1 : static_cast<int64_t>(n);
  if (header_len < 2 || header_len > kMaxHeader || header_len > size - 8) {
    return decode_header(path, "", header_len, size);  // (throws, saying why)
  }
  std::string text(static_cast<size_t>(header_len), '\0');
  f.read_at(8, text.data(), text.size());
  return decode_header(path, text, header_len, size);
}

}  // namespace dtrain::checkpoint
