// `dtrain ckpt`; see cmd_ckpt.h.
#include "apps/dtrain/cmd_ckpt.h"

#include <chrono>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/training_state.h"
#include "core/error.h"

namespace dtrain::apps {

namespace {

std::string bytes_text(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%ld B", static_cast<long>(b));
  }
  return buf;
}

int inspect(const CkptOptions& o) {
  const std::string dir = checkpoint::resolve(o.dir);
  const checkpoint::Manifest m = checkpoint::read_manifest(dir);
  std::printf("checkpoint %s\n", dir.c_str());
  std::printf("  format version %ld, step %ld, saved by %ld ranks\n", static_cast<long>(m.version),
              static_cast<long>(m.step), static_cast<long>(m.world_size));
  std::printf("  layout: %s\n", m.layout.dump().c_str());
  std::printf("  meta: %s\n", m.meta.dump().c_str());
  int64_t total = 0;
  for (const auto& f : m.files) total += f.bytes;
  std::printf("  files (%zu, %s):\n", m.files.size(), bytes_text(total).c_str());
  for (const auto& f : m.files) {
    std::printf("    %-24s %10s  %zu chunks of 1 MiB checksummed (CRC-32), header CRC-32 %08lx\n",
                f.name.c_str(), bytes_text(f.bytes).c_str(), f.crc32.size(),
                static_cast<unsigned long>(f.header_crc32));
  }
  std::printf("  tensors (%zu):\n", m.tensors.size());
  std::printf("    %-40s %-5s %-16s %10s %6s  %s\n", "name", "dtype", "shape", "bytes", "blocks",
              "placement");
  for (const auto& [key, t] : m.tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    std::printf("    %-40s %-5s %-16s %10s %6zu  %s\n", key.c_str(), t.dtype.c_str(),
                checkpoint::dims_to_string(t.shape).c_str(),
                bytes_text(numel * checkpoint::dtype_bytes(t.dtype)).c_str(), t.blocks.size(),
                t.placement.c_str());
  }
  if (o.no_verify) {
    std::printf("  checksums: not verified (--no-verify)\n");
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::verify_files(dir, m);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  checksums: all %zu files verified (%s in %.2f s)\n", m.files.size(),
              bytes_text(total).c_str(), s);
  return 0;
}

int export_file(const CkptOptions& o) {
  const std::string dir = checkpoint::resolve(o.dir);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = checkpoint::export_safetensors(dir, o.out, o.master_weights);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("dtrain ckpt export: %ld tensors of %s (%s) written to %s in %.2f s\n", static_cast<long>(n),
              dir.c_str(), o.master_weights ? "fp32 master weights" : "the parameters", o.out.c_str(), s);
  std::printf("  load it in Python: from safetensors.torch import load_file; state = load_file(\"%s\")\n",
              o.out.c_str());
  return 0;
}

}  // namespace

CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& o) {
  CLI::App* c = app.add_subcommand("ckpt", "Inspect or export a checkpoint that `dtrain train --save` wrote");
  c->require_subcommand(1);
  CLI::App* i = c->add_subcommand("inspect",
                                  "Print the manifest (tensors, shapes, placements, bytes) and "
                                  "verify every file's checksums");
  i->add_option("dir", o.dir, "A step folder, or a --save folder (its latest)")->required();
  i->add_flag("--no-verify", o.no_verify, "Skip reading the files to verify their checksums");
  CLI::App* e = c->add_subcommand("export",
                                  "Write the model as one safetensors file (Python's safetensors and "
                                  "PyTorch load it)");
  e->add_option("dir", o.dir, "A step folder, or a --save folder (its latest)")->required();
  e->add_option("out", o.out, "The .safetensors file to write")->required();
  e->add_flag("--master-weights", o.master_weights,
              "Export the fp32 master weights (runs under bf16 or fp16) instead of the 16-bit parameters");
  return c;
}

int run_ckpt(const CLI::App& ckpt, const CkptOptions& o) {
  if (ckpt.get_subcommand("inspect")->parsed()) return inspect(o);
  return export_file(o);
}

}  // namespace dtrain::apps
