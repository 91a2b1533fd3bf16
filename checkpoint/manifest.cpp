// The manifest; see manifest.h.
#include "checkpoint/manifest.h"

#include <algorithm>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace dtrain::checkpoint {

namespace {

constexpr const char* kFormat = "dtrain-checkpoint";

}  // namespace

nlohmann::json region_json(const Region& r) {
  return {{"box_offset", r.box_offset}, {"box_sizes", r.box_sizes}, {"begin", r.begin}, {"count", r.count}};
}

std::string Manifest::to_json() const {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = version;
  j["step"] = step;
  j["world_size"] = world_size;
  j["layout"] = layout;
  j["meta"] = meta;
  auto& files_j = j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : files) {
    files_j.push_back({{"name", f.name},
                       {"bytes", f.bytes},
                       {"data_offset", f.data_offset},
                       {"header_crc32", f.header_crc32},
                       {"crc32", f.crc32}});
  }
  auto& tensors_j = j["tensors"] = nlohmann::ordered_json::object();
  for (const auto& [key, t] : tensors) {
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    for (const auto& b : t.blocks) {
      nlohmann::ordered_json bj{{"file", b.file}, {"offset", b.offset}};
      const nlohmann::json region = region_json(b.region);
      for (const auto& [k, v] : region.items()) bj[k] = v;
      blocks.push_back(bj);
    }
    tensors_j[key] = {{"dtype", t.dtype}, {"shape", t.shape}, {"placement", t.placement}, {"blocks", blocks}};
  }
  return j.dump(1) + "\n";
}

Manifest Manifest::parse(const std::string& path, const std::string& text) {
  auto bad = [&](const std::string& what) {
    return ValueError(
        str_cat("checkpoint: ", path, ": ", what,
                ". The manifest is damaged; load an earlier checkpoint (its folder, or the root "
                "whose 'latest' names it)."));
  };
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) throw bad("its 'format' is not \"dtrain-checkpoint\"");
  auto integer = [&](const nlohmann::json& o, const char* field, const std::string& where, int64_t min) {
    if (!o.is_object() || !o.contains(field) || !o[field].is_number_integer() ||
        o[field].get<int64_t>() < min) {
      throw bad(str_cat(where, "'", field, "' is missing or not an integer of at least ", min));
    }
    return o[field].get<int64_t>();
  };
  auto sizes = [&](const nlohmann::json& o, const char* field, const std::string& where) {
    if (!o.contains(field) || !o[field].is_array())
      throw bad(str_cat(where, "'", field, "' is not an array"));
    std::vector<int64_t> v;
    for (const auto& d : o[field]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 48)) {
        throw bad(str_cat(where, "'", field, "' holds ", d.dump(), ", not a size"));
      }
      v.push_back(d.get<int64_t>());
    }
    return v;
  };
  Manifest m;
  m.version = integer(j, "version", "", 1);
  if (m.version > kVersion) {
    throw ValueError(str_cat("checkpoint: ", path, " has format version ", m.version,
                             ", newer than the version ", kVersion,
                             " this dtrain reads. Load it with the dtrain that wrote it, or a newer one."));
  }
  m.step = integer(j, "step", "", 0);
  m.world_size = integer(j, "world_size", "", 1);
  if (j.contains("layout") && j["layout"].is_object()) m.layout = j["layout"];
  if (j.contains("meta") && j["meta"].is_object()) m.meta = j["meta"];
  if (!j.contains("files") || !j["files"].is_array()) throw bad("'files' is not an array");
  for (const auto& f : j["files"]) {
    FileInfo fi;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      throw bad("a file has no string 'name'");
    fi.name = f["name"].get<std::string>();
    if (fi.name.empty() || fi.name.find('/') != std::string::npos || fi.name[0] == '.') {
      throw bad(str_cat("file name '", fi.name, "' is not a plain name in the checkpoint's folder"));
    }
    const std::string where = str_cat("file '", fi.name, "': ");
    fi.bytes = integer(f, "bytes", where, 8);
    fi.data_offset = integer(f, "data_offset", where, 8);
    fi.header_crc32 = integer(f, "header_crc32", where, 0);
    if (fi.header_crc32 > 0xffffffffLL) throw bad(str_cat(where, "header_crc32 is not a 32-bit number"));
    if (fi.data_offset > fi.bytes)
      throw bad(str_cat(where, "data_offset ", fi.data_offset, " > bytes ", fi.bytes));
    if (!f.contains("crc32") || !f["crc32"].is_array()) throw bad(str_cat(where, "'crc32' is not an array"));
    for (const auto& c : f["crc32"]) {
      if (!c.is_number_unsigned() || c.get<uint64_t>() > 0xffffffffu)
        throw bad(str_cat(where, "a crc32 is not a 32-bit number"));
      fi.crc32.push_back(static_cast<uint32_t>(c.get<uint64_t>()));
    }
    const int64_t chunks = (fi.bytes - fi.data_offset + kChunkBytes - 1) / kChunkBytes;
    if (static_cast<int64_t>(fi.crc32.size()) != chunks) {
      throw bad(str_cat(where, fi.crc32.size(), " checksums for ", fi.bytes - fi.data_offset,
                        " bytes of data (", chunks, " chunks of 1 MiB)"));
    }
    m.files.push_back(std::move(fi));
  }
  if (!j.contains("tensors") || !j["tensors"].is_object()) throw bad("'tensors' is not an object");
  for (const auto& [key, t] : j["tensors"].items()) {
    const std::string where = str_cat("tensor '", key, "': ");
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string())
      throw bad(str_cat(where, "no string dtype"));
    TensorInfo ti;
    ti.dtype = t["dtype"].get<std::string>();
    int64_t elem = 0;
    try {
      elem = dtype_bytes(ti.dtype);
    } catch (const ValueError& e) {
      throw bad(str_cat(where, e.what()));
    }
    ti.shape = sizes(t, "shape", where);
    if (t.contains("placement") && t["placement"].is_string())
      ti.placement = t["placement"].get<std::string>();
    if (!t.contains("blocks") || !t["blocks"].is_array())
      throw bad(str_cat(where, "'blocks' is not an array"));
    std::vector<Run> all;
    for (const auto& b : t["blocks"]) {
      BlockRef br;
      br.file = integer(b, "file", where, 0);
      if (br.file >= static_cast<int64_t>(m.files.size())) {
        throw bad(str_cat(where, "a block names file ", br.file, " of ", m.files.size()));
      }
      br.offset = integer(b, "offset", where, 0);
      br.region.shape = ti.shape;
      br.region.box_offset = sizes(b, "box_offset", where);
      br.region.box_sizes = sizes(b, "box_sizes", where);
      br.region.begin = integer(b, "begin", where, 0);
      br.region.count = integer(b, "count", where, 0);
      try {
        br.region.validate(str_cat(where, "a block"));
      } catch (const ValueError& e) {
        throw bad(e.what());
      }
      const FileInfo& f = m.files[static_cast<size_t>(br.file)];
      if (br.offset > f.bytes - f.data_offset ||
          br.region.count * elem > f.bytes - f.data_offset - br.offset) {
        throw bad(str_cat(where, "a block of ", br.region.count * elem, " bytes at data byte ", br.offset,
                          " leaves file '", f.name, "' (", f.bytes - f.data_offset, " bytes of data)"));
      }
      for (Run r : runs_of(br.region)) all.push_back(r);
      ti.blocks.push_back(std::move(br));
    }
    std::sort(all.begin(), all.end(), [](const Run& a, const Run& b) { return a.global < b.global; });
    int64_t at = 0;
    for (const Run& r : all) {
      if (r.global != at) {
        throw bad(str_cat(where, "its blocks ", r.global < at ? "overlap" : "leave a gap", " at element ",
                          std::min(at, r.global)));
      }
      at += r.length;
    }
    int64_t numel = 1;
    for (int64_t d : ti.shape) numel *= d;
    if (at != numel) throw bad(str_cat(where, "its blocks hold ", at, " of its ", numel, " elements"));
    m.tensors.emplace(key, std::move(ti));
  }
  return m;
}

}  // namespace dtrain::checkpoint
