#include "snapshot/snapshot_codec.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/optim.hpp>

#include <ATen/core/Generator.h>

#include <cstring>
#include <mutex>
#include <sstream>

namespace mpiddp::detail {

namespace {

// The generators this rank draws from: the CPU one, and the GPU's when training there.
std::vector<at::Generator> generators(c10::Device device) {
  std::vector<at::Generator> g{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
  if (device.is_cuda()) g.push_back(at::globalContext().defaultGenerator(device));
  return g;
}

torch::Tensor bytes_tensor(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

void model_to_snapshot(const Model& model, Snapshot& s) {
  for (const auto& [name, t] : model.named_parameters()) s.tensors["model/" + name] = t.detach().cpu();
  for (const auto& [name, t] : model.named_buffers()) s.tensors["model/" + name] = t.detach().cpu();
  // The built-in GPT's shape, whoever trained it (the CLI or the library): `mpiddp generate` reads it.
  if (const auto gpt = std::dynamic_pointer_cast<GptImpl>(model.module())) s.texts[kGptConfigKey] = gpt->config().to_json();
}

void model_from_snapshot(Model& model, const Snapshot& s) { load_named(model, s.tensors, "model/"); }

std::string optimizer_kind(const torch::optim::Optimizer& opt) {
  const auto* spec = optimizer_spec_of(opt);
  return spec ? spec->name : "other";
}

void optimizer_to_snapshot(const torch::optim::Optimizer& opt, const NamedTensors& params, Snapshot& s) {
  const auto* spec = optimizer_spec_of(opt);
  if (!spec) {  // not one of the table's: libtorch's own archive, whole
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    s.tensors["optimizer/archive"] = bytes_tensor(out.str());
    return;
  }
  for (const auto& [name, p] : params) {
    const auto* st = state_of(opt, p);
    if (!st) continue;
    const std::string prefix = "optimizer/" + name + "/";
    const auto fields = spec->fields_of(*st);
    if (spec->counts_steps) s.tensors[prefix + "step"] = torch::tensor(fields.step, torch::kLong);
    for (const auto& [field, t] : fields.tensors) s.tensors[prefix + field] = t.cpu();
  }
}

void optimizer_from_snapshot(torch::optim::Optimizer& opt, const NamedTensors& params, const Snapshot& s,
                             c10::Device device) {
  const auto* spec = optimizer_spec_of(opt);
  if (!spec) {
    auto it = s.tensors.find("optimizer/archive");
    MPIDDP_CHECK(it != s.tensors.end(), "snapshot: no optimizer/archive for this optimizer");
    const auto t = it->second.contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()), device);
    opt.load(archive);
    return;
  }
  auto& state = opt.state();
  for (const auto& [name, p] : params) {
    const std::string prefix = "optimizer/" + name + "/";
    ParamStateFields fields;
    for (const auto& field : spec->state_fields) {
      const auto t = s.tensors.find(prefix + field);
      if (t != s.tensors.end()) fields.tensors[field] = t->second.to(device);
    }
    if (spec->counts_steps) {
      const auto step = s.tensors.find(prefix + "step");
      if (step == s.tensors.end()) continue;  // never stepped
      fields.step = step->second.item<int64_t>();
    } else if (fields.tensors.empty()) {
      continue;  // no state (yet): SGD without momentum
    }
    state[compat::optimizer_state_key(state, p.unsafeGetTensorImpl())] = spec->state_from(fields);
  }
}

namespace {

// RunPosition's fields under their snapshot keys: the one list both directions read.
struct IntKey {
  const char* key;
  int64_t RunPosition::*field;
};
struct RealKey {
  const char* key;
  double RunPosition::*field;
};
constexpr IntKey kIntKeys[] = {{"epoch", &RunPosition::epoch},
                               {"step_in_epoch", &RunPosition::step_in_epoch},
                               {"global_step", &RunPosition::global_step},
                               {"skipped_steps", &RunPosition::skipped}};
constexpr RealKey kRealKeys[] = {{"epoch_loss_sum", &RunPosition::loss_sum},
                                 {"epoch_seconds", &RunPosition::seconds},
                                 {"lr", &RunPosition::lr}};
// fp16's loss scaler, present only when loss scaling is on (amp_loss_scale > 0).
constexpr IntKey kScalerInts[] = {{"amp_growth_tracker", &RunPosition::growth_tracker},
                                  {"amp_overflow_steps", &RunPosition::overflow}};
constexpr RealKey kScaler = {"amp_loss_scale", &RunPosition::loss_scale};

}  // namespace

void position_to_snapshot(const RunPosition& p, Snapshot& s) {
  for (const auto& k : kIntKeys) s.ints[k.key] = p.*k.field;
  for (const auto& k : kRealKeys) s.reals[k.key] = p.*k.field;
  if (p.loss_scale > 0) {
    s.reals[kScaler.key] = p.*kScaler.field;
    for (const auto& k : kScalerInts) s.ints[k.key] = p.*k.field;
  }
}

RunPosition position_from_snapshot(const Snapshot& s) {
  RunPosition p;
  for (const auto& k : kIntKeys) p.*k.field = s.ints.at(k.key);
  for (const auto& k : kRealKeys) {
    if (const auto it = s.reals.find(k.key); it != s.reals.end()) p.*k.field = it->second;
  }
  if (const auto it = s.reals.find(kScaler.key); it != s.reals.end()) {
    p.*kScaler.field = it->second;
    for (const auto& k : kScalerInts) p.*k.field = s.ints.at(k.key);
  }
  return p;
}

std::string rng_state_bytes(c10::Device device) {
  std::string bytes;
  for (auto& g : generators(device)) {
    std::lock_guard<std::mutex> lock(g.mutex());
    auto t = g.get_state().contiguous();
    const auto n = static_cast<uint64_t>(t.numel());
    bytes.append(reinterpret_cast<const char*>(&n), sizeof n);
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(n));
  }
  return bytes;
}

void set_rng_state(c10::Device device, const torch::Tensor& packed) {
  const auto* p = packed.data_ptr<uint8_t>();
  const auto* end = p + packed.numel();
  for (auto& g : generators(device)) {
    uint64_t n = 0;
    MPIDDP_CHECK(end - p >= static_cast<ptrdiff_t>(sizeof n), "snapshot: RNG state too short for this device");
    std::memcpy(&n, p, sizeof n);
    p += sizeof n;
    MPIDDP_CHECK(end - p >= static_cast<ptrdiff_t>(n), "snapshot: RNG state too short for this device");
    auto t = torch::empty({static_cast<int64_t>(n)}, torch::kByte);
    std::memcpy(t.data_ptr(), p, n);
    p += n;
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(t);
  }
}

}  // namespace mpiddp::detail
