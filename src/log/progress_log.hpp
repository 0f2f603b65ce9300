// What rank 0 reports of a training run: progress lines within an epoch (loss, samples/s, FLOP/s
// and MFU where known, ETA), the metrics JSON lines and the TensorBoard events, per progress line
// and per epoch. Local to rank 0: it calls no collective (every number it reports was agreed or
// measured before).
#pragma once

#include <mpiddp/model.hpp>
#include <mpiddp/runtime.hpp>
#include <mpiddp/tensorboard.hpp>
#include <mpiddp/trainer_options.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/run_position.hpp"

namespace mpiddp::detail {

/// Rank 0's files: the JSON-lines metrics and the TensorBoard events. Opened by the Trainer's
/// constructor (after every check), closed with it; elsewhere both stay closed.
struct RunLogs {
  std::ofstream metrics;
  std::unique_ptr<SummaryWriter> tensorboard;

  /// Opens what `options` names, on rank 0 only; throws naming a file it cannot write.
  RunLogs(const TrainerOptions& options, int rank);
  bool any() const { return metrics.is_open() || tensorboard != nullptr; }
  void line(const nlohmann::json& j);
  void scalar(const std::string& tag, double value, int64_t step);
};

/// A measured samples/s and what it makes: tokens/s, FLOP/s and MFU, each 0 where unknown (and
/// then left out of the records).
struct Rates {
  double samples_per_s = 0, tokens_per_s = 0, flops_per_s = 0, mfu = 0;
};

/// What a samples/s becomes tokens/s, FLOP/s and MFU with (0 where unknown).
struct Throughput {
  int64_t tokens_per_sample = 0;  ///< Task::tokens_per_sample(): token data's block size
  double flops_per_sample = 0;  ///< model FLOPs of one sample's forward and backward (Model::training_flops_per_sample)
  double peak_flops_per_s = 0;  ///< the job's dense peak: every rank's device together

  Rates at(double samples_per_s) const {
    const double flops_per_s = samples_per_s * flops_per_sample;
    return {samples_per_s, samples_per_s * static_cast<double>(tokens_per_sample), flops_per_s,
            peak_flops_per_s > 0 ? flops_per_s / peak_flops_per_s : 0};
  }
};

/// What a run's samples/s makes tokens/s, FLOP/s and MFU with: the option's FLOPs per sample, else
/// the model's own, and the job's dense peak (flops.hpp) where its devices and precision have one.
Throughput throughput_of(const TrainerOptions& options, const Model& model, int64_t tokens_per_sample,
                         const Runtime& runtime);

/// One epoch's numbers as the metrics file writes them ("kind": "epoch"); TensorBoard's epoch/*
/// scalars are the same numbers. Both read one table of EpochMetrics' fields (progress_log.cpp).
nlohmann::json to_json(const EpochMetrics& m, int world_size);

/// The epoch's line as `mpiddp train` prints it: "epoch 3: train loss 0.1234, test loss ..., 123.4
/// samples/s, 5.6 s, lr 0.01" (the test figures, tokens/s, skipped steps and the loss scale where known).
std::string epoch_line(const EpochMetrics& m);

/// "123.4 samples/s", for token data "123.4 samples/s (31590 tokens/s)": the rate as the progress
/// lines and the epoch line print it.
std::string samples_text(double samples_per_s, double tokens_per_s);

class ProgressLog {
 public:
  using Note = std::function<void(const std::string&)>;
  /// `note`: rank 0's line sink (nullptr: none); `throughput`: the figures its lines report tokens/s,
  /// FLOP/s and MFU with, where known. Writes the run's options to TensorBoard, and a session
  /// start when `from` is a resumed position (its steps will be seen again).
  ProgressLog(RunLogs& logs, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
              const RunPosition& from, const Throughput& throughput, Note note);

  /// Each epoch's lines start afresh (evaluation is not training time).
  void start_epoch() { window_ = Window{}; }
  /// After each step (`loss`: this rank's, ignored when the step was skipped for a bad loss).
  void on_step(const RunPosition& p, double loss, bool skipped) {
    if (!active_) return;
    ++window_.steps;
    window_.loss += skipped ? 0.0 : loss;
    maybe_report(p);
  }
  /// The epoch's numbers to the metrics file and TensorBoard.
  void on_epoch(const EpochMetrics& m);

 private:
  struct Window {  // the steps since the last line
    int64_t steps = 0;
    double loss = 0;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };
  void maybe_report(const RunPosition& p);

  RunLogs& logs_;
  const TrainerOptions& options_;
  const RunPlan plan_;
  const int world_size_;
  const Throughput throughput_;
  const bool active_;        ///< rank 0 with somewhere to write
  const int64_t log_steps_;  ///< a line every this many steps (0: none by steps)
  Note note_;
  Window window_;
};

}  // namespace mpiddp::detail
