#include "snapshot/snapshot_codec.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/optim.hpp>
#include <mpiddp/runtime.hpp>
#include <mpiddp/units.hpp>
#include <mpiddp/zero.hpp>

#include <ATen/core/Generator.h>

#include "common/text.hpp"
#include "snapshot/parallel_snapshot.hpp"

#include <cstring>
#include <mutex>
#include <set>
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
  if (const auto gpt = std::dynamic_pointer_cast<GptImpl>(model.module()))
    s.texts[kGptConfigKey] = gpt->config().to_json();
}

namespace {

// A table optimizer's state by snapshot name, where it lives (the device's tensors, no copies).
std::map<std::string, torch::Tensor> state_tensors(const torch::optim::Optimizer& opt, const OptimizerSpec& spec,
                                                   const NamedTensors& params) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, p] : params) {
    const auto* st = state_of(opt, p);
    if (!st) continue;
    const std::string prefix = "optimizer/" + name + "/";
    const auto fields = spec.fields_of(*st);
    if (spec.counts_steps) out[prefix + "step"] = torch::tensor(fields.step, torch::kLong);
    for (const auto& [field, t] : fields.tensors) out[prefix + field] = t;
  }
  return out;
}

}  // namespace

void model_parts(const Model& model, const ZeroOptimizer* zero, int rank, int size, std::vector<TensorPart>& parts,
                 Snapshot& meta) {
  std::map<const void*, size_t> sharded;  // ZeRO stage 3's unit parameters: each rank writes what it owns
  for (size_t i = 0; zero && i < zero->parameters().size(); ++i) {
    if (!zero->holds_whole(i)) sharded[zero->parameters()[i].unsafeGetTensorImpl()] = i;
  }
  for (const auto& [name, t] : model.named_parameters()) {
    const auto it = sharded.find(t.unsafeGetTensorImpl());
    if (it == sharded.end()) {
      parts.push_back(even_share("model/" + name, t, rank, size));
      continue;
    }
    const auto [first, numel] = zero->owned_range(it->second);
    parts.push_back({"model/" + name, t.scalar_type(), t.sizes().vec(), first,
                     numel > 0 ? zero->owned_values(it->second) : torch::Tensor()});
  }
  for (const auto& [name, t] : model.named_buffers()) parts.push_back(even_share("model/" + name, t, rank, size));
  if (const auto gpt = std::dynamic_pointer_cast<GptImpl>(model.module()))
    meta.texts[kGptConfigKey] = gpt->config().to_json();
}

void model_from_reader(Model& model, SnapshotReader& reader) {
  torch::NoGradGuard no_grad;
  auto load = [&](const NamedTensors& named, const char* what) {
    for (const auto& [name, t] : named) {
      const auto* d = reader.find("model/" + name);
      MPIDDP_CHECK(d, std::string("no tensor for the model's ") + what + " '" + name + "'");
      MPIDDP_CHECK(c10::IntArrayRef(d->shape) == t.sizes(), std::string("the model's ") + what + " '" + name + "' is " +
                                                                shape_text(t.sizes()) + " but the snapshot's is " +
                                                                shape_text(d->shape));
      if (!is_deferred(t)) t.copy_(reader.read_whole("model/" + name));
    }
  };
  load(model.named_parameters(), "parameter");
  load(model.named_buffers(), "buffer");
  reader.verdict();
}

namespace {

// The names each parameter of `params` goes by, by tensor (tied weights: several, in order).
std::map<const void*, std::vector<std::string>> names_of(const NamedTensors& params) {
  std::map<const void*, std::vector<std::string>> names;
  for (const auto& [name, p] : params) names[p.unsafeGetTensorImpl()].push_back(name);
  return names;
}

}  // namespace

void model_slices_from_reader(const NamedTensors& params, ZeroOptimizer& zero, SnapshotReader& reader) {
  torch::NoGradGuard no_grad;
  const auto names = names_of(params);
  for (size_t i = 0; i < zero.parameters().size(); ++i) {
    if (zero.holds_whole(i)) continue;
    const auto& p = zero.parameters()[i];
    const auto [first, numel] = zero.owned_range(i);
    auto slice = torch::empty({numel}, p.scalar_type());
    reader.read("model/" + names.at(p.unsafeGetTensorImpl()).front(), first, slice);
    if (numel > 0) zero.owned_values(i).copy_(slice);
  }
  reader.verdict();
}

void optimizer_parts(const torch::optim::Optimizer& opt, const NamedTensors& params, const ZeroOptimizer* zero,
                     MPI_Comm comm, std::vector<TensorPart>& parts) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto* spec = optimizer_spec_of(opt);
  if (!spec) {  // not a table optimizer: libtorch's archive, rank 0's (its bytes may differ by rank)
    Snapshot other;
    std::string why;
    if (rank == 0) {
      try {
        optimizer_to_snapshot(opt, params, other);
      } catch (const std::exception& e) {
        why = reason_of(e);
      }
    }
    const int64_t bytes =
        allgather_int64(comm, {why.empty() && rank == 0 ? other.tensors.at("optimizer/archive").numel() : -1})[0];
    broadcast_string(comm, why);
    if (bytes < 0) MPIDDP_THROW_AGREED("cannot serialize the optimizer: " + why);
    parts.push_back({"optimizer/archive",
                     torch::kByte,
                     {bytes},
                     0,
                     rank == 0 ? other.tensors.at("optimizer/archive") : torch::Tensor()});
    return;
  }
  if (!zero) {  // every rank holds the whole state alike: an even share each
    for (const auto& [name, t] : state_tensors(opt, *spec, params)) parts.push_back(even_share(name, t, rank, size));
    return;
  }
  const auto names = names_of(params);
  const auto layout = zero->state_layout();
  const auto& zparams = zero->parameters();
  for (size_t i = 0; i < zparams.size(); ++i) {
    if (!layout[i].present) continue;
    const auto mine = zero->owned_state(i);
    const auto first = zero->owned_range(i).first;
    for (const auto& name : names.at(zparams[i].unsafeGetTensorImpl())) {  // under each name, as stage 0
      const std::string prefix = "optimizer/" + name + "/";
      if (spec->counts_steps) {
        parts.push_back(owned_by(0, rank, prefix + "step", torch::tensor(layout[i].step, torch::kLong)));
      }
      for (const auto& [field, dtype] : layout[i].fields) {
        torch::Tensor part;
        if (mine && mine->tensors.count(field)) part = mine->tensors.at(field).reshape(-1);
        parts.push_back({prefix + field, dtype, zparams[i].sizes().vec(), first, part});
      }
    }
  }
}

void optimizer_from_reader(torch::optim::Optimizer& opt, const NamedTensors& params, ZeroOptimizer* zero,
                           SnapshotReader& reader, c10::Device device) {
  const auto* spec = optimizer_spec_of(opt);
  if (!zero) {  // every rank the whole state
    Snapshot whole;
    for (const auto& [name, p] : params) {
      const std::string prefix = "optimizer/" + name + "/";
      for (const auto& field : spec ? spec->state_fields : std::vector<std::string>{}) {
        if (reader.find(prefix + field)) whole.tensors[prefix + field] = reader.read_whole(prefix + field);
      }
      if (reader.find(prefix + "step")) whole.tensors[prefix + "step"] = reader.read_whole(prefix + "step");
    }
    if (!spec && reader.find("optimizer/archive"))
      whole.tensors["optimizer/archive"] = reader.read_whole("optimizer/archive");
    reader.verdict();
    optimizer_from_snapshot(opt, params, whole, device);
    return;
  }
  // ZeRO: each rank reads the elements it owns, into the shards' state.
  const auto names = names_of(params);
  const auto& zparams = zero->parameters();
  for (size_t i = 0; i < zparams.size(); ++i) {
    const std::string prefix = "optimizer/" + names.at(zparams[i].unsafeGetTensorImpl()).front() + "/";
    const auto [first, numel] = zero->owned_range(i);
    ParamStateFields fields;
    for (const auto& field : spec->state_fields) {
      const auto* d = reader.find(prefix + field);
      if (!d) continue;
      auto slice = torch::empty({numel}, d->dtype->type);
      reader.read(prefix + field, first, slice);
      fields.tensors[field] = slice;
    }
    const bool stepped = reader.find(prefix + "step") != nullptr;
    if (stepped) fields.step = reader.read_whole(prefix + "step").item<int64_t>();
    if (numel == 0 || (spec->counts_steps ? !stepped : fields.tensors.empty())) continue;
    for (auto& [field, t] : fields.tensors) t = t.to(device);
    zero->set_owned_state(i, fields);
  }
  reader.verdict();
}

void rng_parts(MPI_Comm comm, c10::Device device, std::vector<TensorPart>& parts) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const auto mine = bytes_tensor(rng_state_bytes(device));
  const auto sizes = allgather_int64(comm, {mine.numel()});
  for (int r = 0; r < size; ++r) {
    parts.push_back({"rng/rank" + std::to_string(r),
                     torch::kByte,
                     {sizes[static_cast<size_t>(r)]},
                     0,
                     r == rank ? mine : torch::Tensor()});
  }
}

void rng_from_reader(SnapshotReader& reader, int saved_world, int source, c10::Device device) {
  torch::Tensor mine;
  for (int r = 0; r < saved_world; ++r) {
    const std::string name = "rng/rank" + std::to_string(r);
    const auto* d = reader.find(name);
    MPIDDP_CHECK(d, "snapshot '" + reader.path() + "' has no " + name);
    torch::Tensor out = r == source ? torch::empty(d->shape, torch::kByte) : torch::Tensor();
    reader.read(name, 0, out);
    if (r == source) mine = out;
  }
  reader.verdict();
  set_rng_state(device, mine);
}

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
  for (auto& [name, t] : state_tensors(opt, *spec, params)) s.tensors[name] = t.cpu();
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
constexpr RealKey kRealKeys[] = {
    {"epoch_loss_sum", &RunPosition::loss_sum}, {"epoch_seconds", &RunPosition::seconds}, {"lr", &RunPosition::lr}};
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
