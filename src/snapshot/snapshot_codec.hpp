// What a snapshot holds of a training run besides its progress: the model's parameters and
// buffers, the optimizer's state and every rank's RNG state, to Snapshot tensors and back.
#pragma once

#include <mpiddp/snapshot.hpp>
#include <mpiddp/model.hpp>

#include <torch/torch.h>

#include <string>

namespace mpiddp::detail {

/// "model/<name>" for every parameter and buffer.
void model_to_snapshot(const Model& model, Snapshot& s);
void model_from_snapshot(Model& model, const Snapshot& s);

/// "sgd", "adam", "adamw" (their state is stored per parameter, readable with h5py), else "other"
/// (stored as the optimizer's own serialized archive).
std::string optimizer_kind(const torch::optim::Optimizer& opt);
/// "optimizer/<parameter>/<field>" for SGD, Adam and AdamW; "optimizer/archive" for any other.
void optimizer_to_snapshot(const torch::optim::Optimizer& opt, const NamedTensors& params, Snapshot& s);
void optimizer_from_snapshot(torch::optim::Optimizer& opt, const NamedTensors& params, const Snapshot& s,
                             c10::Device device);

/// This rank's RNG states (the CPU generator's, and the GPU's when `device` is one), packed.
std::string rng_state_bytes(c10::Device device);
void set_rng_state(c10::Device device, const torch::Tensor& packed);

}  // namespace mpiddp::detail
