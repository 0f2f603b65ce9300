#include "train/train_state.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>

#include <ATen/core/Generator.h>

#include <cstring>
#include <mutex>
#include <sstream>

namespace mpiddp::detail {

namespace {

template <class State>
void adam_state_out(const State& st, const std::string& prefix, Snapshot& s) {
  s.tensors[prefix + "step"] = torch::tensor(static_cast<int64_t>(st.step()), torch::kLong);
  s.tensors[prefix + "exp_avg"] = st.exp_avg().cpu();
  s.tensors[prefix + "exp_avg_sq"] = st.exp_avg_sq().cpu();
  if (st.max_exp_avg_sq().defined()) s.tensors[prefix + "max_exp_avg_sq"] = st.max_exp_avg_sq().cpu();
}

template <class State>
std::unique_ptr<State> adam_state_in(const Snapshot& s, const std::string& prefix, c10::Device device) {
  auto st = std::make_unique<State>();
  st->step(s.tensors.at(prefix + "step").template item<int64_t>());
  st->exp_avg(s.tensors.at(prefix + "exp_avg").to(device));
  st->exp_avg_sq(s.tensors.at(prefix + "exp_avg_sq").to(device));
  auto m = s.tensors.find(prefix + "max_exp_avg_sq");
  if (m != s.tensors.end()) st->max_exp_avg_sq(m->second.to(device));
  return st;
}

const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  const auto& state = opt.state();
  auto it = state.find(compat::optimizer_state_key(state, p.unsafeGetTensorImpl()));
  return it == state.end() ? nullptr : it->second.get();
}

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
}

void model_from_snapshot(Model& model, const Snapshot& s) { load_named(model, s.tensors, "model/"); }

std::string optimizer_kind(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt)) return "sgd";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&opt)) return "adam";
  return "other";
}

void optimizer_to_snapshot(const torch::optim::Optimizer& opt, const NamedTensors& params, Snapshot& s) {
  const auto kind = optimizer_kind(opt);
  if (kind == "other") {
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
    if (kind == "sgd") {
      const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*st);
      if (sgd.momentum_buffer().defined()) s.tensors[prefix + "momentum_buffer"] = sgd.momentum_buffer().cpu();
    } else if (kind == "adam") {
      adam_state_out(static_cast<const torch::optim::AdamParamState&>(*st), prefix, s);
    } else {
      adam_state_out(static_cast<const torch::optim::AdamWParamState&>(*st), prefix, s);
    }
  }
}

void optimizer_from_snapshot(torch::optim::Optimizer& opt, const NamedTensors& params, const Snapshot& s,
                             c10::Device device) {
  const auto kind = optimizer_kind(opt);
  if (kind == "other") {
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
    const auto key = compat::optimizer_state_key(state, p.unsafeGetTensorImpl());
    if (kind == "sgd") {
      auto m = s.tensors.find(prefix + "momentum_buffer");
      if (m == s.tensors.end()) continue;
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(m->second.to(device));
      state[key] = std::move(st);
    } else if (s.tensors.count(prefix + "step")) {
      if (kind == "adam") state[key] = adam_state_in<torch::optim::AdamParamState>(s, prefix, device);
      else state[key] = adam_state_in<torch::optim::AdamWParamState>(s, prefix, device);
    }
  }
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
