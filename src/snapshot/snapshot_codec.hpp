// What a snapshot holds of a training run besides its progress: the model's parameters and
// buffers, the optimizer's state and every rank's RNG state, to Snapshot tensors and back.
#pragma once

#include <mpiddp/snapshot.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>

#include <torch/torch.h>

#include <string>

#include "train/run_position.hpp"

namespace mpiddp::detail {

/// The text key of the built-in GPT's shape (GptConfig::to_json) in a snapshot of one.
constexpr const char* kGptConfigKey = "gpt_config";
/// "model/<name>" for every parameter and buffer; the GPT's shape under kGptConfigKey.
void model_to_snapshot(const Model& model, Snapshot& s);
void model_from_snapshot(Model& model, const Snapshot& s);

/// "sgd", "adam", "adamw" (their state is stored per parameter, readable with h5py), else "other"
/// (stored as the optimizer's own serialized archive).
std::string optimizer_kind(const torch::optim::Optimizer& opt);
/// "optimizer/<parameter>/<field>" for SGD, Adam and AdamW; "optimizer/archive" for any other.
void optimizer_to_snapshot(const torch::optim::Optimizer& opt, const NamedTensors& params, Snapshot& s);
void optimizer_from_snapshot(torch::optim::Optimizer& opt, const NamedTensors& params, const Snapshot& s,
                             c10::Device device);

/// Where the run stands: its keys written once, for saving and loading (epoch, step_in_epoch,
/// global_step, skipped_steps as ints; epoch_loss_sum, epoch_seconds, lr as reals; fp16's scaler
/// as amp_loss_scale, amp_growth_tracker, amp_overflow_steps when loss scaling is on).
void position_to_snapshot(const RunPosition& p, Snapshot& s);
RunPosition position_from_snapshot(const Snapshot& s);

/// This rank's RNG states (the CPU generator's, and the GPU's when `device` is one), packed.
std::string rng_state_bytes(c10::Device device);
void set_rng_state(c10::Device device, const torch::Tensor& packed);

}  // namespace mpiddp::detail
