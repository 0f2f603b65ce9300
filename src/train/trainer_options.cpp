// check_trainer_options(): the one owner of every option's rule. The Trainer calls it with the
// fields' own names; `mpiddp train` calls it with its flags' names, so a rule and its message live
// here only.
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>
#include <mpiddp/zero.hpp>

#include <cmath>
#include <filesystem>

namespace mpiddp {

void check_trainer_options(const TrainerOptions& o, const std::function<std::string(const std::string& field)>& name,
                           int rank) {
  const auto n = [&](const char* field) { return name ? name(field) : "TrainerOptions::" + std::string(field); };
  MPIDDP_CHECK(!o.data.empty(), n("data") + " (the training set) is required");
  MPIDDP_CHECK(o.epochs >= 0, n("epochs") + " must be >= 0 (0: as many as " + n("max_steps") + " takes), got " +
                                  std::to_string(o.epochs));
  MPIDDP_CHECK(o.batch_size > 0, n("batch_size") + " must be > 0, got " + std::to_string(o.batch_size));
  MPIDDP_CHECK(o.grad_accum > 0,
               n("grad_accum") + " must be > 0 (1: no accumulation), got " + std::to_string(o.grad_accum));
  check_zero_stage(o.zero_stage, n("zero_stage"));
  // The Trainer reduces by zero_stage and carries its step agreement in the mean tail: one owner each.
  MPIDDP_CHECK(!o.ddp.reduction, n("ddp.reduction") + " is the Trainer's to choose: set " + n("zero_stage"));
  MPIDDP_CHECK(o.ddp.mean_tail_values == 0, n("ddp.mean_tail_values") + " is the Trainer's (its step agreement)");
  check_data_format(o.data_format, n("data_format"));
  MPIDDP_CHECK(o.block_size >= 0, n("block_size") + " must be >= 0, got " + std::to_string(o.block_size));
  MPIDDP_CHECK(o.max_steps >= 0, n("max_steps") + " must be >= 0");
  MPIDDP_CHECK(o.profile_first_step >= 0,
               n("profile_first_step") + " must be >= 0, got " + std::to_string(o.profile_first_step));
  MPIDDP_CHECK(o.profile_steps > 0, n("profile_steps") + " must be > 0, got " + std::to_string(o.profile_steps));
  MPIDDP_CHECK(o.log_every_steps >= -1, n("log_every_steps") + " must be >= -1 (-1: a tenth of an epoch)");
  MPIDDP_CHECK(o.log_every_seconds >= 0 && o.log_min_gap_seconds >= 0,
               n("log_every_seconds") + " and " + n("log_min_gap_seconds") + " must be >= 0");
  MPIDDP_CHECK(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm),
               n("clip_grad_norm") + " must be >= 0 (0: no clipping), got " + std::to_string(o.clip_grad_norm));
  MPIDDP_CHECK(o.precision == c10::kFloat || o.precision == c10::kBFloat16 || o.precision == c10::kHalf,
               n("precision") + " must be kFloat, kBFloat16 or kHalf, got " + std::string(c10::toString(o.precision)));
  MPIDDP_CHECK(o.loss_scaling.init_scale > 0 && std::isfinite(o.loss_scaling.init_scale),
               n("loss_scaling.init_scale") + " must be > 0, got " + std::to_string(o.loss_scaling.init_scale));
  MPIDDP_CHECK(
      o.flops_per_sample >= 0 && std::isfinite(o.flops_per_sample),
      n("flops_per_sample") + " must be >= 0 (0: the model's own figure), got " + std::to_string(o.flops_per_sample));
  MPIDDP_CHECK(o.save_every >= 0, n("save_every") + " must be >= 0");
  MPIDDP_CHECK(o.save_every_steps >= 0, n("save_every_steps") + " must be >= 0");
  MPIDDP_CHECK(o.keep >= 0, n("keep") + " must be >= 0");
  MPIDDP_CHECK(o.cache_bytes >= 0, n("cache_bytes") + " must be >= 0");
  MPIDDP_CHECK(o.prefetch_batches >= 0, n("prefetch_batches") + " must be >= 0 (0: no reader thread), got " +
                                            std::to_string(o.prefetch_batches));
  MPIDDP_CHECK(!o.resume.empty(), n("resume") + " takes auto, never or a snapshot file");
  // Checked where the error is printed; every rank opens it (a rank that cannot: resume says so).
  if (o.resume != "auto" && o.resume != "never" && rank == 0) {
    MPIDDP_CHECK(std::filesystem::exists(o.resume), n("resume") + ": snapshot '" + o.resume + "' does not exist");
  }
}

}  // namespace mpiddp
