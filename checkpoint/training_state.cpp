// A training run's state as checkpoint pieces; see training_state.h.
#include "checkpoint/training_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/file_io.h"
#include "checkpoint/safetensors.h"
#include "comm/gather_text.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::checkpoint {

namespace {

at::Tensor flat(const at::Tensor& t) {
  DTRAIN_ASSERT(t.is_contiguous(), "a checkpointed tensor must be contiguous");
  return t.detach().reshape({-1});
}

// The optimizer's name: those whose state is known here.
const char* optimizer_type(torch::optim::Optimizer& o) {
  if (dynamic_cast<torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<torch::optim::SGD*>(&o)) return "SGD";
  throw NotSupportedError(
      "checkpoint: the optimizer is not AdamW, Adam or SGD, whose state dtrain knows how to save. Use one of "
      "them.");
}

template <typename Options>
const Options& options_of(torch::optim::Optimizer& o, const at::Tensor& p) {
  for (auto& g : o.param_groups()) {
    for (const auto& q : g.params()) {
      if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return static_cast<const Options&>(g.options());
    }
  }
  DTRAIN_ASSERT(false, "a tensor the optimizer does not step");
  return static_cast<const Options&>(o.param_groups().front().options());
}

// The optimizer's state tensors of `p`, by name; none before its first step.
std::vector<std::pair<std::string, at::Tensor>> optimizer_state(torch::optim::Optimizer& o,
                                                                const at::Tensor& p) {
  optimizer_type(o);  // (NotSupportedError for an optimizer whose state is not known here)
  auto it = o.state().find(p.unsafeGetTensorImpl());
  if (it == o.state().end()) return {};
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    out = {{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
    if (s->max_exp_avg_sq().defined()) out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    out = {{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
    if (s->max_exp_avg_sq().defined()) out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    if (s->momentum_buffer().defined()) out = {{"momentum_buffer", s->momentum_buffer()}};
  }
  return out;
}

// The names of the state the optimizer keeps per tensor (what optimizer_state gives once it stepped).
std::vector<std::string> state_names(torch::optim::Optimizer& o, const at::Tensor& p) {
  const std::string type = optimizer_type(o);
  if (type == "SGD") {
    if (options_of<torch::optim::SGDOptions>(o, p).momentum() == 0) return {};
    return {"momentum_buffer"};
  }
  const bool ams = type == "AdamW" ? options_of<torch::optim::AdamWOptions>(o, p).amsgrad()
                                   : options_of<torch::optim::AdamOptions>(o, p).amsgrad();
  std::vector<std::string> names{"exp_avg", "exp_avg_sq"};
  if (ams) names.push_back("max_exp_avg_sq");
  return names;
}

int64_t optimizer_step(torch::optim::Optimizer& o) {
  int64_t step = 0;
  for (auto& [key, s] : o.state()) {
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(s.get())) step = std::max(step, a->step());
    if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s.get())) step = std::max(step, a->step());
  }
  return step;
}

// Replaces the optimizer's state of `p` by `named` tensors (as state_names gives them), at step count `step`.
void install_state(torch::optim::Optimizer& o, const at::Tensor& p,
                   const std::map<std::string, at::Tensor>& named, int64_t step) {
  auto get = [&](const char* name) {
    auto it = named.find(name);
    return it == named.end() ? at::Tensor() : it->second;
  };
  const std::string type = optimizer_type(o);
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  if (type == "AdamW" || type == "Adam") {
    auto fill = [&](auto s) {
      s->step(step);
      s->exp_avg(get("exp_avg"));
      s->exp_avg_sq(get("exp_avg_sq"));
      if (get("max_exp_avg_sq").defined()) s->max_exp_avg_sq(get("max_exp_avg_sq"));
      return s;
    };
    if (type == "AdamW") {
      state = fill(std::make_unique<torch::optim::AdamWParamState>());
    } else {
      state = fill(std::make_unique<torch::optim::AdamParamState>());
    }
  } else {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(get("momentum_buffer"));
    state = std::move(s);
  }
  o.state()[p.unsafeGetTensorImpl()] = std::move(state);
}

std::string list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 5; ++i) s += str_cat(i ? ", " : "", "'", names[i], "'");
  if (names.size() > 5) s += str_cat(" and ", names.size() - 5, " more");
  return s;
}

}  // namespace

TrainingState::TrainingState(torch::nn::Module& module, parallel::Parallelized& par,
                             optim::MixedPrecision* mp)
    : module_(module), par_(par), mp_(mp) {}

std::vector<Piece> TrainingState::pieces(bool for_load, std::vector<Slot>* slots) const {
  std::vector<Piece> out;
  const auto given = par_.given_tensors();
  const auto layout = par_.state_layout();
  const std::vector<at::Tensor> none;
  const auto& masters = mp_ ? mp_->masters() : none;
  torch::optim::Optimizer& opt = par_.optimizer();
  auto* tp = const_cast<parallel::Parallelized&>(par_).tensor_parallel();
  auto slot = [&](Slot::Kind kind, size_t k, int64_t offset, int64_t count, const std::string& state) {
    if (slots) slots->push_back({kind, k, offset, count, state});
  };
  for (size_t k = 0; k < layout.size(); ++k) {
    const at::Tensor& stepped = masters.empty() ? given.at(k) : masters.at(k);
    // saving: the state the optimizer holds (none before its first step); loading: what it will hold, made
    // only once every rank has read everything (commit)
    std::vector<std::pair<std::string, at::Tensor>> states;
    if (for_load) {
      for (const auto& name : state_names(opt, stepped)) states.emplace_back(name, stepped.detach());
    } else {
      states = optimizer_state(opt, stepped);
    }
    for (const auto& s : layout[k]) {
      Region r;
      r.shape = s.sizes;
      r.box_offset.assign(s.sizes.size(), 0);
      r.box_sizes = s.sizes;
      if (tp) {
        const auto part = tp->part_of(s.param);
        if (part.count >= 0) {
          r.shape[part.dim] = part.global;
          r.box_offset[part.dim] = part.start;
        }
      }
      r.begin = s.param_offset;
      r.count = s.count;
      const std::string placement = par_.placement_of(s.param);
      auto add = [&](const std::string& key, const at::Tensor& t, Slot::Kind kind, const std::string& state) {
        out.push_back({key, flat(t).narrow(0, s.offset, s.count), r, placement, false, true});
        slot(kind, k, s.offset, s.count, state);
      };
      add("model/" + s.param, given.at(k), Slot::kModel, "");
      if (!masters.empty()) add("master/" + s.param, masters.at(k), Slot::kMaster, "");
      for (const auto& [name, t] : states) add("optim/" + name + "/" + s.param, t, Slot::kOptim, name);
    }
  }
  for (const auto& b : module_.named_buffers()) {
    out.push_back({"buffer/" + b.key(), flat(b.value()), Region::whole(b.value().sizes().vec()),
                   "Replicate (every rank)", for_load, true});
    slot(Slot::kBuffer, 0, 0, b.value().numel(), "");
  }
  const int rank = par_.world()->group_rank();
  at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  out.push_back(
      {str_cat("rng/cpu/rank", rank), rng, Region::whole({rng.numel()}), "this rank's own", true, false});
  slot(Slot::kRng, 0, 0, rng.numel(), "");
  return out;
}

std::string TrainingState::save(const std::string& root, int64_t step, const nlohmann::json& meta,
                                int64_t keep) {
  torch::optim::Optimizer& opt = par_.optimizer();
  SaveOptions so;
  so.keep = keep;
  auto* tp = par_.tensor_parallel();
  so.layout = {{"strategy", parallel::to_string(par_.strategy())},
               {"tp", tp ? tp->group()->group_size() : 1},
               {"world_size", par_.world()->group_size()},
               {"precision", mp_ ? optim::to_string(mp_->precision()) : "fp32"}};
  nlohmann::json lrs = nlohmann::json::array();
  for (auto& g : opt.param_groups()) lrs.push_back(g.options().get_lr());
  so.meta = {{"optimizer", {{"type", optimizer_type(opt)}, {"step", optimizer_step(opt)}, {"lr", lrs}}},
             {"caller", meta.is_null() ? nlohmann::json::object() : meta}};
  if (mp_) so.meta["skipped"] = mp_->skipped();
  if (mp_ && mp_->precision() == optim::Precision::kFp16) {
    const auto s = mp_->scaler().state();
    so.meta["scaler"] = {{"scale", s.scale},
                         {"steps", s.steps},
                         {"last_overflow", s.last_overflow},
                         {"hysteresis_left", s.hysteresis_left},
                         {"skipped", s.skipped}};
  }
  return checkpoint::save(root, step, pieces(false, nullptr), par_.world(), so);
}

Resumed TrainingState::load(const std::string& path) {
  Resumed res;
  std::vector<Piece> want;
  std::vector<Slot> slots;
  std::vector<at::Tensor> loaded;
  Manifest m;
  comm::on_every_rank(par_.world(), "checkpoint load", [&] {
    res.dir = resolve(path);
    m = read_manifest(res.dir);
    want = pieces(true, &slots);
    // the module's parameter names against the checkpoint's, both ways
    std::set<std::string> ours, theirs;
    for (const auto& p : module_.named_parameters()) ours.insert(p.key());
    for (const auto& [key, t] : m.tensors) {
      if (key.rfind("model/", 0) == 0) theirs.insert(key.substr(6));
    }
    std::vector<std::string> missing, extra;
    for (const auto& n : ours)
      if (!theirs.count(n)) missing.push_back(n);
    for (const auto& n : theirs)
      if (!ours.count(n)) extra.push_back(n);
    if (!missing.empty() || !extra.empty()) {
      throw ValueError(
          str_cat("checkpoint: ", res.dir, " is not of this model: ",
                  missing.empty() ? "" : str_cat("it lacks the model's parameters ", list(missing)),
                  !missing.empty() && !extra.empty() ? "; " : "",
                  extra.empty() ? "" : str_cat("it holds parameters the model lacks: ", list(extra)),
                  ". Load a checkpoint of a model of the same configuration."));
    }
    const bool has_optim = std::any_of(m.tensors.begin(), m.tensors.end(),
                                       [](const auto& t) { return t.first.rfind("optim/", 0) == 0; });
    const std::string type = optimizer_type(par_.optimizer());
    if (has_optim && m.meta.value("optimizer", nlohmann::json::object()).value("type", "") != type) {
      throw ValueError(str_cat("checkpoint: ", res.dir, " holds the state of optimizer ",
                               m.meta["optimizer"].value("type", "?"), " but this run uses ", type,
                               ". Use the same optimizer, or import only the weights (an export)."));
    }
    for (auto& p : want) {
      const std::string name = p.key.substr(p.key.find('/') + 1);
      // another precision's checkpoint: fp32 masters from the parameters, or the parameters from the masters
      if (p.key.rfind("master/", 0) == 0 && !m.tensors.count(p.key)) p.key = "model/" + name;
      if (p.key.rfind("model/", 0) == 0 && m.tensors.count(p.key) && m.tensors.count("master/" + name) &&
          scalar_type(m.tensors.at(p.key).dtype) != p.data.scalar_type()) {
        p.key = "master/" + name;
      }
      if (p.key.rfind("optim/", 0) == 0 && !has_optim) p.optional = true;
    }
    // a rank's random stream means nothing at another world size: not restored there
    if (m.world_size != par_.world()->group_size()) {
      for (size_t i = 0; i < want.size(); ++i) {
        if (slots[i].kind == Slot::kRng) want[i].optional = true, want[i].key += " (another world size)";
      }
    }
    loaded = read_pieces(res.dir, m, want);
  });
  commit(want, slots, loaded, m, false);
  res.step = m.step;
  res.meta = m.meta.value("caller", nlohmann::json::object());
  for (size_t i = 0; i < want.size(); ++i) {
    if (slots[i].kind == Slot::kRng && loaded[i].defined()) res.rng_restored = true;
  }
  return res;
}

void TrainingState::commit(const std::vector<Piece>& want, const std::vector<Slot>& slots,
                           const std::vector<at::Tensor>& loaded, const Manifest& m, bool weights_only) {
  at::NoGradGuard no_grad;
  // the optimizer's state per tensor it steps, from its segments (a tensor held whole takes the loaded one
  // as it is, without a copy)
  std::map<std::pair<size_t, std::string>, std::vector<size_t>> states;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!loaded[i].defined()) continue;
    switch (slots[i].kind) {
      case Slot::kRng: {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        gen.set_state(loaded[i]);
        break;
      }
      case Slot::kOptim:
        states[{slots[i].k, slots[i].state}].push_back(i);
        break;
      default:
        want[i].data.copy_(loaded[i]);
    }
  }
  if (!states.empty()) {
    torch::optim::Optimizer& opt = par_.optimizer();
    const int64_t step = m.meta["optimizer"].value("step", int64_t{0});
    const auto given = par_.given_tensors();
    const std::vector<at::Tensor> none;
    const auto& masters = mp_ ? mp_->masters() : none;
    std::map<size_t, std::map<std::string, at::Tensor>> by_tensor;
    for (const auto& [where, pieces] : states) {
      const at::Tensor& stepped = masters.empty() ? given.at(where.first) : masters.at(where.first);
      at::Tensor whole;
      const at::Tensor& first = loaded[pieces.front()];
      if (pieces.size() == 1 && first.numel() == stepped.numel() &&
          first.scalar_type() == stepped.scalar_type()) {
        whole = first.view(stepped.sizes());
      } else {
        int64_t covered = 0;
        for (size_t i : pieces) covered += slots[i].count;
        whole = covered == stepped.numel() ? at::empty_like(stepped.detach(), at::MemoryFormat::Contiguous)
                                           : at::zeros_like(stepped.detach(), at::MemoryFormat::Contiguous);
        for (size_t i : pieces) whole.view({-1}).narrow(0, slots[i].offset, slots[i].count).copy_(loaded[i]);
      }
      by_tensor[where.first][where.second] = whole;
    }
    for (const auto& [k, named] : by_tensor) {
      install_state(opt, masters.empty() ? given.at(k) : masters.at(k), named, step);
    }
  }
  if (!weights_only) {
    if (m.meta.contains("optimizer") && m.meta["optimizer"].contains("lr")) {
      const auto& lrs = m.meta["optimizer"]["lr"];
      auto& groups = par_.optimizer().param_groups();
      for (size_t g = 0; g < groups.size() && g < lrs.size(); ++g)
        groups[g].options().set_lr(lrs[g].get<double>());
    }
    // fp16's scaler where the checkpoint has one (a checkpoint of another precision: a fresh scaler)
    const bool fp16 = mp_ && mp_->precision() == optim::Precision::kFp16;
    if (fp16 && m.meta.contains("scaler")) {
      const auto& s = m.meta["scaler"];
      mp_->restore(
          {s.value("scale", 65536.0), s.value("steps", int64_t{0}), s.value("last_overflow", int64_t{-1}),
           s.value("hysteresis_left", int64_t{0}), s.value("skipped", int64_t{0})},
          0);
    } else if (mp_ && !fp16) {
      mp_->restore({}, m.meta.value("skipped", int64_t{0}));
    }
  }
  par_.given_tensors_changed();
}

void TrainingState::import_weights(const std::string& path) {
  std::vector<Piece> want;
  std::vector<Slot> slots;
  std::vector<at::Tensor> loaded;
  Manifest m;
  comm::on_every_rank(par_.world(), "checkpoint import", [&] {
    m = manifest_of_safetensors(path, "model/");
    std::set<std::string> ours;
    for (const auto& p : module_.named_parameters()) ours.insert(p.key());
    std::vector<std::string> missing, extra;
    for (const auto& n : ours)
      if (!m.tensors.count("model/" + n)) missing.push_back(n);
    for (const auto& [key, t] : m.tensors)
      if (!ours.count(key.substr(6))) extra.push_back(key.substr(6));
    if (!missing.empty() || !extra.empty()) {
      throw ValueError(
          str_cat("import: ", path, " does not hold this model's parameters: ",
                  missing.empty() ? "" : str_cat("it lacks ", list(missing)),
                  !missing.empty() && !extra.empty() ? "; " : "",
                  extra.empty() ? "" : str_cat("it holds ", list(extra), ", which the model lacks"),
                  ". Import a file saved from a model of the same configuration."));
    }
    std::vector<Slot> all;
    const auto every = pieces(true, &all);
    for (size_t i = 0; i < every.size(); ++i) {
      Piece p = every[i];
      const std::string name = p.key.substr(p.key.find('/') + 1);
      if (all[i].kind == Slot::kModel || all[i].kind == Slot::kMaster) {
        p.key = "model/" + name;
        want.push_back(p);
        slots.push_back(all[i]);
      }
    }
    const std::string dir = std::filesystem::path(path).parent_path().string();
    loaded = read_pieces(dir.empty() ? "." : dir, m, want);
  });
  commit(want, slots, loaded, m, true);
}

int64_t export_safetensors(const std::string& step_dir, const std::string& out, bool master_weights) {
  const Manifest m = read_manifest(step_dir);
  const std::string prefix = master_weights ? "master/" : "model/";
  std::vector<SafetensorsEntry> entries;
  std::vector<std::string> keys;
  int64_t at = 0;
  for (const auto& [key, t] : m.tensors) {
    if (key.rfind(prefix, 0) != 0) continue;
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t bytes = numel * dtype_bytes(t.dtype);
    entries.push_back({key.substr(prefix.size()), t.dtype, t.shape, at, at + bytes});
    keys.push_back(key);
    at += bytes;
  }
  if (entries.empty()) {
    throw ValueError(str_cat(
        "export: ", step_dir, " holds no ",
        master_weights ? "fp32 master weights (it was saved under fp32: export without --master-weights)"
                       : "parameters",
        "."));
  }
  // widest first: every tensor aligned to its element size in the file
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_bytes(entries[a].dtype) > dtype_bytes(entries[b].dtype);
  });
  std::vector<SafetensorsEntry> sorted;
  at = 0;
  for (size_t i : order) {
    SafetensorsEntry e = entries[i];
    e.end = at + (e.end - e.begin);
    e.begin = at;
    at = e.end;
    sorted.push_back(e);
  }
  const std::string header =
      encode_header(sorted, {{"format", "pt"}, {"dtrain_step", std::to_string(m.step)}});
  const std::string tmp = str_cat(out, ".tmp.", ::getpid());
  try {
    File f(tmp, File::Mode::kCreate);
    f.write(header.data(), header.size());
    for (size_t i : order) {
      const TensorInfo& t = m.tensors.at(keys[i]);
      Piece p{keys[i], at::empty({0}, scalar_type(t.dtype)), Region::whole(t.shape), "", false, true};
      const at::Tensor v = read_pieces(step_dir, m, {p})[0];
      f.write(v.data_ptr(), static_cast<size_t>(v.numel() * v.element_size()));
    }
    f.sync();
    f.close();
    if (std::rename(tmp.c_str(), out.c_str()) != 0) {
      throw ValueError(str_cat("export: cannot rename ", tmp, " to ", out, "."));
    }
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  return static_cast<int64_t>(entries.size());
}

}  // namespace dtrain::checkpoint
