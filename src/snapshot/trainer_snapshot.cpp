// The Trainer's snapshots: what it writes (model, optimizer, every rank's RNG, progress) and how
// a run resumes from one (rank 0 picks and checks, every rank loads the same bytes).
#include <mpiddp/snapshot.hpp>
#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/host.hpp"
#include "common/text.hpp"
#include "train/run_position.hpp"
#include "snapshot/snapshot_codec.hpp"

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

std::string Trainer::save(const detail::RunPosition& p) {
  // Every rank's RNG state goes to rank 0, which alone writes; its verdict is broadcast so that
  // every rank fails alike when the write fails.
  const auto& o = options_;
  const auto rng = gather_strings(runtime_.world(), detail::rng_state_bytes(o.device));
  std::string status, path;
  if (runtime_.rank() == 0) {
    try {
      Snapshot s;
      detail::model_to_snapshot(*model_, s);
      detail::optimizer_to_snapshot(*optimizer_, model_->named_parameters(), s);
      for (size_t r = 0; r < rng.size(); ++r) {
        auto t = torch::empty({static_cast<int64_t>(rng[r].size())}, torch::kByte);
        std::memcpy(t.data_ptr(), rng[r].data(), rng[r].size());
        s.tensors["rng/rank" + std::to_string(r)] = t;
      }
      const auto& script = model_->torchscript_bytes();
      if (!script.empty()) {
        auto t = torch::empty({static_cast<int64_t>(script.size())}, torch::kByte);
        std::memcpy(t.data_ptr(), script.data(), script.size());
        s.tensors["torchscript"] = t;
      }
      s.ints = {{"steps_per_epoch", steps_per_epoch_},
                {"world_size", runtime_.size()},
                {"threads", torch::get_num_threads()},
                {"batch_size", o.batch_size},
                {"grad_accum", o.grad_accum},
                {"sampler_seed", static_cast<int64_t>(o.seed)},
                {"sampler_epoch", p.epoch},
                {"sampler_position", p.step_in_epoch * o.samples_per_step()},
                {"sampler_shuffle", o.shuffle ? 1 : 0},
                {"sampler_drop_last", o.drop_last ? 1 : 0}};
      s.reals = {{"created_unix_s", detail::unix_seconds()}};
      detail::position_to_snapshot(p, s);  // fp16: the scaler continues where it was
      // Beside the codecs' own texts (the GPT's shape): added, not assigned.
      s.texts.insert({{"model", model_->description()},
                      {"optimizer", detail::optimizer_kind(*optimizer_)},
                      {"model_fingerprint", fingerprint()},
                      {"config", o.run_config},
                      {"mpiddp_version", MPIDDP_VERSION},
                      {"torch_version", compat::torch_version()}});
      path = SnapshotDir(o.snapshot_dir).save(s, p.global_step, o.keep);
    } catch (const std::exception& e) {
      status = detail::reason_of(e);
    }
  }
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

std::optional<detail::RunPosition> Trainer::restore(const std::function<void(const std::string&)>& note,
                                                  std::string* from) {
  const auto& o = options_;
  // Rank 0 picks the snapshot and checks it; the verdict, then the file's bytes, are broadcast,
  // so every rank loads the same state (the snapshot directory need not be shared).
  std::string status, name;
  std::vector<char> image;
  if (runtime_.rank() == 0 && o.resume != "never") {
    const bool automatic = o.resume == "auto";
    std::vector<std::string> candidates;
    if (!automatic) candidates.push_back(o.resume);
    else if (!o.snapshot_dir.empty()) candidates = SnapshotDir(o.snapshot_dir).list();
    const std::string mine = fingerprint();
    for (const auto& path : candidates) {
      try {
        auto bytes = read_file_bytes(path);
        const auto why = incompatibility(read_snapshot_image(bytes, path), mine, detail::optimizer_kind(*optimizer_));
        if (!why.empty()) {
          status = "cannot resume from snapshot '" + path + "': " + why;
          break;
        }
        image = std::move(bytes);
        name = path;
        break;
      } catch (const Error& e) {
        if (!automatic) {
          status = "cannot resume: " + e.message();
          break;
        }
        if (note) note("warning: " + e.message() + "; falling back to the previous snapshot");
      }
    }
    if (status.empty() && image.empty() && !candidates.empty()) {
      status = "cannot resume: no valid snapshot in '" + o.snapshot_dir + "' (all " +
               std::to_string(candidates.size()) + " refused; see above)";
    }
  }
  broadcast_string(runtime_.world(), status);
  if (!status.empty()) MPIDDP_THROW_AGREED(status);
  broadcast_bytes(runtime_.world(), image);
  if (image.empty()) return std::nullopt;
  broadcast_string(runtime_.world(), name);
  Snapshot s;
  try {
    s = read_snapshot_image(image, name);
    detail::model_from_snapshot(*model_, s);
    detail::optimizer_from_snapshot(*optimizer_, model_->named_parameters(), s, o.device);
  } catch (const Error& e) {
    MPIDDP_THROW_AGREED(e.message());  // the same bytes on every rank: the same verdict
  }
  // Each rank continues its own random stream; ranks the snapshot did not have take rank 0's.
  const int saved_world = static_cast<int>(s.ints.at("world_size"));
  const int source = runtime_.rank() < saved_world ? runtime_.rank() : 0;
  detail::set_rng_state(o.device, s.tensors.at("rng/rank" + std::to_string(source)));

  detail::RunPosition p = detail::position_from_snapshot(s);
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
           std::to_string(o.samples_per_step()) + (saved_world * saved_batch == global_batch
                                                ? " (same global batch: same global data order)"
                                                : " (another global batch: another data order)"));
    }
  }
  if (note) {
    note("Resuming training from snapshot at Epoch " + std::to_string(p.epoch + 1) +
         (p.step_in_epoch > 0 ? ", step " + std::to_string(p.step_in_epoch) : std::string()) + " (global step " +
         std::to_string(p.global_step) + ", " + name + ")");
  }
  if (from) *from = name;
  return p;
}

}  // namespace mpiddp
