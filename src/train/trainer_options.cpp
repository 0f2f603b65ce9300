// TrainerOptions::validate(): the one owner of every option's rule. The Trainer calls it with the
// fields' own names; `mpiddp train` calls it with its flags' names, so a rule and its message live
// here only.
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <cmath>
#include <filesystem>

namespace mpiddp {

void TrainerOptions::validate(const std::function<std::string(const std::string& field)>& name, int rank) const {
  const auto n = [&](const char* field) { return name ? name(field) : "TrainerOptions::" + std::string(field); };
  MPIDDP_CHECK(!data.empty(), n("data") + " (the training set) is required");
  MPIDDP_CHECK(epochs >= 0, n("epochs") + " must be >= 0 (0: as many as " + n("max_steps") + " takes), got " +
                                std::to_string(epochs));
  MPIDDP_CHECK(batch_size > 0, n("batch_size") + " must be > 0, got " + std::to_string(batch_size));
  MPIDDP_CHECK(grad_accum > 0,
               n("grad_accum") + " must be > 0 (1: no accumulation), got " + std::to_string(grad_accum));
  check_zero_stage(zero_stage, n("zero_stage"));
  // The Trainer reduces by zero_stage and carries its step agreement in the mean tail: one owner each.
  MPIDDP_CHECK(!ddp.reduction, n("ddp.reduction") + " is the Trainer's to choose: set " + n("zero_stage"));
  MPIDDP_CHECK(ddp.mean_tail_values == 0, n("ddp.mean_tail_values") + " is the Trainer's (its step agreement)");
  MPIDDP_CHECK(data_format == "auto" || data_format == "hdf5" || data_format == "llmc" || data_format == "raw-uint16",
               "unknown " + n("data_format") + " '" + data_format + "' (auto, hdf5, llmc, raw-uint16)");
  MPIDDP_CHECK(block_size >= 0, n("block_size") + " must be >= 0, got " + std::to_string(block_size));
  MPIDDP_CHECK(max_steps >= 0, n("max_steps") + " must be >= 0");
  MPIDDP_CHECK(profile_first_step >= 0,
               n("profile_first_step") + " must be >= 0, got " + std::to_string(profile_first_step));
  MPIDDP_CHECK(profile_steps > 0, n("profile_steps") + " must be > 0, got " + std::to_string(profile_steps));
  MPIDDP_CHECK(log_every_steps >= -1, n("log_every_steps") + " must be >= -1 (-1: a tenth of an epoch)");
  MPIDDP_CHECK(log_every_seconds >= 0 && log_min_gap_seconds >= 0,
               n("log_every_seconds") + " and " + n("log_min_gap_seconds") + " must be >= 0");
  MPIDDP_CHECK(clip_grad_norm >= 0 && std::isfinite(clip_grad_norm),
               n("clip_grad_norm") + " must be >= 0 (0: no clipping), got " + std::to_string(clip_grad_norm));
  MPIDDP_CHECK(precision == c10::kFloat || precision == c10::kBFloat16 || precision == c10::kHalf,
               n("precision") + " must be kFloat, kBFloat16 or kHalf, got " + std::string(c10::toString(precision)));
  MPIDDP_CHECK(loss_scaling.init_scale > 0 && std::isfinite(loss_scaling.init_scale),
               n("loss_scaling.init_scale") + " must be > 0, got " + std::to_string(loss_scaling.init_scale));
  MPIDDP_CHECK(
      flops_per_sample >= 0 && std::isfinite(flops_per_sample),
      n("flops_per_sample") + " must be >= 0 (0: the model's own figure), got " + std::to_string(flops_per_sample));
  MPIDDP_CHECK(save_every >= 0, n("save_every") + " must be >= 0");
  MPIDDP_CHECK(save_every_steps >= 0, n("save_every_steps") + " must be >= 0");
  MPIDDP_CHECK(keep >= 0, n("keep") + " must be >= 0");
  MPIDDP_CHECK(cache_bytes >= 0, n("cache_bytes") + " must be >= 0");
  MPIDDP_CHECK(prefetch_batches >= 0,
               n("prefetch_batches") + " must be >= 0 (0: no reader thread), got " + std::to_string(prefetch_batches));
  MPIDDP_CHECK(!resume.empty(), n("resume") + " takes auto, never or a snapshot file");
  // Checked where the error is printed; every rank opens it (a rank that cannot: resume says so).
  if (resume != "auto" && resume != "never" && rank == 0) {
    MPIDDP_CHECK(std::filesystem::exists(resume), n("resume") + ": snapshot '" + resume + "' does not exist");
  }
}

}  // namespace mpiddp
