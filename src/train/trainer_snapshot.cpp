// The Trainer's snapshots: what it writes (model, optimizer, every rank's RNG, progress), every
// rank its own part of one file, and how a run resumes from one (every rank verifies it with the
// others and reads what it needs: under ZeRO only its own slices of the optimizer's state, and of a
// deferred model's parameters at stage 3).
#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/snapshot.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/host.hpp"
#include "common/run_position.hpp"
#include "common/text.hpp"
#include "runtime/agreement.hpp"
#include "snapshot/parallel_snapshot.hpp"
#include "snapshot/snapshot_codec.hpp"
#include "zero/model_sharding.hpp"

namespace mpiddp {

namespace {

std::string tensor_text(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + detail::shape_text(t.sizes());
}

}  // namespace

std::string Trainer::fingerprint() const {
  std::string text = "model " + model_->description() + "\n";
  for (const auto& [name, t] : model_->named_parameters()) text += "parameter " + name + " " + tensor_text(t) + "\n";
  for (const auto& [name, t] : model_->named_buffers()) text += "buffer " + name + " " + tensor_text(t) + "\n";
  return text;
}

std::string Trainer::save(const detail::RunPosition& p, const ZeroOptimizer* zero) {
  // Every rank writes its own part of the one file: an even share of what all ranks hold alike,
  // its own ZeRO slices, its own RNG state. Rank 0's attributes describe the run.
  const auto& o = options_;
  const int rank = runtime_.rank(), size = runtime_.size();
  std::vector<detail::TensorPart> parts;
  Snapshot meta;
  detail::model_parts(*model_, zero, rank, size, parts, meta);
  detail::optimizer_parts(*optimizer_, model_->named_parameters(), zero, runtime_.world(), parts);
  detail::rng_parts(runtime_.world(), o.device, parts);
  const auto& file = model_->file();  // a model from Python: its file, under its format's name
  torch::Tensor file_bytes;
  if (!file.bytes.empty()) {
    file_bytes = torch::empty({static_cast<int64_t>(file.bytes.size())}, torch::kByte);
    std::memcpy(file_bytes.data_ptr(), file.bytes.data(), file.bytes.size());
    parts.push_back(detail::even_share(file.format, file_bytes, rank, size));
  }
  meta.ints = {{"steps_per_epoch", steps_per_epoch_}, {"world_size", size},
               {"threads", torch::get_num_threads()}, {"batch_size", o.batch_size},
               {"grad_accum", o.grad_accum},          {"zero_stage", o.zero_stage}};
  meta.reals = {{"created_unix_s", detail::unix_seconds()}};
  detail::position_to_snapshot(p, meta);  // fp16: the scaler continues where it was
  // Beside the codecs' own texts (the GPT's shape): added, not assigned.
  meta.texts.insert({{"model", model_->description()},
                     {"optimizer", detail::optimizer_kind(*optimizer_)},
                     {"model_fingerprint", fingerprint()},
                     {"config", o.run_config},
                     {"mpiddp_version", MPIDDP_VERSION},
                     {"torch_version", compat::torch_version()}});
  const SnapshotDir dir(o.snapshot_dir);
  const std::string path = dir.path_of(p.global_step);
  try {
    detail::write_parallel_snapshot(runtime_.world(), path, parts, meta);
  } catch (const AgreedError& e) {  // anything else (a timeout) is not every rank's: it propagates
    MPIDDP_THROW_AGREED(e.message() + " (the previous snapshot is intact)");
  }
  detail::LocalFailure published;  // rank 0's alone: its verdict is broadcast
  if (rank == 0) published.run([&] { dir.publish(path, o.keep); });
  std::string status = published.reason();
  broadcast_string(runtime_.world(), status);
  if (!status.empty()) MPIDDP_THROW_AGREED(status + " (the previous snapshot is intact)");
  return path;
}

namespace {

// Why a snapshot cannot continue this run ("" : it can): another model (the first differing
// line of the fingerprints) or another optimizer.
std::string incompatibility(const Snapshot& s, const std::string& fingerprint, const std::string& optimizer) {
  auto text = [&](const char* key) {
    auto it = s.texts.find(key);
    return it == s.texts.end() ? std::string() : it->second;
  };
  const std::string theirs = text("model_fingerprint");
  if (theirs != fingerprint) {
    std::istringstream a(theirs), b(fingerprint);
    std::string la, lb;
    while (true) {
      const bool more_a = static_cast<bool>(std::getline(a, la)), more_b = static_cast<bool>(std::getline(b, lb));
      if (!more_a && !more_b) break;
      if (!more_a) return "it is of another model: it lacks this model's " + lb;
      if (!more_b) return "it is of another model: it has " + la + ", which this model lacks";
      if (la != lb) return "it is of another model: it has " + la + " where this model has " + lb;
    }
  }
  if (text("optimizer") != optimizer) {
    return "it was trained with optimizer " + text("optimizer") + ", this run uses " + optimizer;
  }
  return "";
}

}  // namespace

std::unique_ptr<detail::SnapshotReader> Trainer::restore(const std::function<void(const std::string&)>& note,
                                                         std::string* from, detail::RunPosition& p) {
  const auto& o = options_;
  if (o.resume == "never") return nullptr;
  // Rank 0 names the candidates (the directory is every rank's: snapshots are written by all);
  // every rank opens each in turn until one verifies, all with the same verdicts.
  const bool automatic = o.resume == "auto";
  std::string listed;
  if (runtime_.rank() == 0) {
    if (!automatic)
      listed = o.resume;
    else if (!o.snapshot_dir.empty()) {
      for (const auto& path : SnapshotDir(o.snapshot_dir).list()) listed += path + "\n";
    }
  }
  broadcast_string(runtime_.world(), listed);
  const auto candidates = detail::split_list(listed, '\n');
  std::unique_ptr<detail::SnapshotReader> reader;
  for (const auto& path : candidates) {
    try {
      reader = std::make_unique<detail::SnapshotReader>(runtime_.world(), path);
      break;
    } catch (const AgreedError& e) {  // every rank is here with the same message
      if (!automatic) MPIDDP_THROW_AGREED("cannot resume: " + e.message());
      if (note) note("warning: " + e.message() + "; falling back to the previous snapshot");
    }
  }
  if (!reader) {
    if (candidates.empty()) return nullptr;
    MPIDDP_THROW_AGREED("cannot resume: no valid snapshot in '" + o.snapshot_dir + "' (all " +
                        std::to_string(candidates.size()) + " refused; see above)");
  }
  const std::string name = reader->path();
  const Snapshot& s = reader->meta();
  const auto why = incompatibility(s, fingerprint(), detail::optimizer_kind(*optimizer_));
  if (!why.empty()) MPIDDP_THROW_AGREED("cannot resume from snapshot '" + name + "': " + why);
  // Each rank continues its own random stream; ranks the snapshot did not have take rank 0's.
  const int saved_world = static_cast<int>(s.ints.at("world_size"));
  const int source = runtime_.rank() < saved_world ? runtime_.rank() : 0;
  detail::as_agreed([&] {  // its checks read the catalog every rank holds: the same verdict
    detail::model_from_reader(*model_, *reader);
    detail::rng_from_reader(*reader, saved_world, source, o.device);
  });

  // Each rank continues its own random stream; ranks the snapshot did not have take rank 0's.
  p = detail::position_from_snapshot(s);
  // Samples per rank per step: the batch times the micro-steps (snapshots before grad_accum: 1).
  const int64_t saved_batch = s.ints.at("batch_size") * (s.ints.count("grad_accum") ? s.ints.at("grad_accum") : 1);
  if (saved_world != runtime_.size() || saved_batch != o.samples_per_step()) {
    // Same global data order only when the global batch is kept; the position in the epoch is
    // carried over as samples consumed.
    const int64_t consumed = p.step_in_epoch * saved_batch * saved_world;
    const int64_t global_batch = o.samples_per_step() * runtime_.size();
    p.step_in_epoch = consumed / global_batch;
    if (note) {
      note("note: the snapshot was taken at " + std::to_string(saved_world) + " rank(s) x batch " +
           std::to_string(saved_batch) + "; continuing at " + std::to_string(runtime_.size()) + " x " +
           std::to_string(o.samples_per_step()) +
           (saved_world * saved_batch == global_batch ? " (same global batch: same global data order)"
                                                      : " (another global batch: another data order)"));
    }
  }
  if (note) {
    note("Resuming training from snapshot at Epoch " + std::to_string(p.epoch + 1) +
         (p.step_in_epoch > 0 ? ", step " + std::to_string(p.step_in_epoch) : std::string()) + " (global step " +
         std::to_string(p.global_step) + ", " + name + ")");
  }
  if (from) *from = name;
  return reader;
}

void Trainer::restore_shards(detail::SnapshotReader& reader, ZeroOptimizer* zero) {
  detail::as_agreed([&] {  // its checks read the catalog every rank holds: the same verdict
    if (sharding_->slices_from_snapshot()) detail::model_slices_from_reader(model_->named_parameters(), *zero, reader);
    detail::optimizer_from_reader(*optimizer_, model_->named_parameters(), zero, reader, options_.device);
  });
}

}  // namespace mpiddp
