// SnapshotPolicy: when a run writes a snapshot. Every rank applies the same rule to the same
// position, so every rank enters the (collective) save at the same step.
#pragma once

#include <mpiddp/trainer_options.hpp>

#include "common/run_position.hpp"

namespace mpiddp::detail {

class SnapshotPolicy {
 public:
  explicit SnapshotPolicy(const TrainerOptions& o)
      : enabled_(!o.snapshot_dir.empty()), every_epochs_(o.save_every), every_steps_(o.save_every_steps) {}

  bool enabled() const { return enabled_; }
  /// After the step that reached `p`: every save_every_steps steps, and when a stop signal ends
  /// the run there (the snapshot then holds the position mid-epoch).
  bool after_step(const RunPosition& p, bool stopping) const {
    return enabled_ && (stopping || (every_steps_ > 0 && p.global_step % every_steps_ == 0));
  }
  /// After the epoch that ended at `p`: every save_every epochs and after the run's last epoch
  /// (the snapshot then starts the next epoch, or holds `p` itself where --max-steps ended the run
  /// inside the epoch).
  bool after_epoch(const RunPosition& p, bool last) const {
    return enabled_ && (last || (every_epochs_ > 0 && (p.epoch + 1) % every_epochs_ == 0));
  }

 private:
  bool enabled_;
  int64_t every_epochs_, every_steps_;
};

}  // namespace mpiddp::detail
