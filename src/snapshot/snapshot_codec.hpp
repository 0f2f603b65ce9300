// What a snapshot holds of a training run besides its progress: the model's parameters and
// buffers, the optimizer's state and every rank's RNG state, to Snapshot tensors and back.
#pragma once

#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/snapshot.hpp>

#include <mpi.h>
#include <torch/torch.h>

#include <string>

#include "common/run_position.hpp"

namespace mpiddp {
class ZeroOptimizer;
}

namespace mpiddp::detail {

struct TensorPart;  // parallel_snapshot.hpp
class SnapshotReader;

/// The text key of the built-in GPT's shape (GptConfig::to_json) in a snapshot of one.
constexpr const char* kGptConfigKey = "gpt_config";
/// "model/<name>" for every parameter and buffer; the GPT's shape under kGptConfigKey.
void model_to_snapshot(const Model& model, Snapshot& s);

// What each rank writes of a run into its one snapshot file, and reads back (parallel_snapshot.hpp).
/// "model/<name>": an even share of every parameter and buffer (ZeRO stage 3's sharded parameters:
/// each rank its owned range); the GPT's shape into `meta`.
void model_parts(const Model& model, const ZeroOptimizer* zero, int rank, int size, std::vector<TensorPart>& parts,
                 Snapshot& meta);
/// Every parameter and buffer, whole on every rank (read once, all-gathered), but deferred ones
/// (units.hpp), which model_slices_from_reader() reads once ZeRO has sharded them. Collective.
void model_from_reader(Model& model, SnapshotReader& reader);
/// ZeRO stage 3's sharded parameters: each rank reads its own elements. Collective.
void model_slices_from_reader(const NamedTensors& params, ZeroOptimizer& zero, SnapshotReader& reader);
/// The optimizer's state as optimizer_to_snapshot names it: under ZeRO (`zero`) each rank's own
/// slices, else an even share of the state every rank holds alike (another optimizer's archive:
/// rank 0's). Collective.
void optimizer_parts(const torch::optim::Optimizer& opt, const NamedTensors& params, const ZeroOptimizer* zero,
                     MPI_Comm comm, std::vector<TensorPart>& parts);
/// Its inverse: under ZeRO each rank reads only its slices. Collective.
void optimizer_from_reader(torch::optim::Optimizer& opt, const NamedTensors& params, ZeroOptimizer* zero,
                           SnapshotReader& reader, c10::Device device);
/// "rng/rank<r>": rank r's RNG states, each written by its rank. Collective.
void rng_parts(MPI_Comm comm, c10::Device device, std::vector<TensorPart>& parts);
/// This rank's RNG states from "rng/rank<source>". Collective (every rank passes over every rank's).
void rng_from_reader(SnapshotReader& reader, int saved_world, int source, c10::Device device);

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
