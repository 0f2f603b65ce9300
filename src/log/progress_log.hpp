// What rank 0 reports of a training run: progress lines within an epoch (loss, samples/s, ETA),
// the metrics JSON lines and the TensorBoard events, per progress line and per epoch. Local to
// rank 0: it calls no collective (every number it reports was agreed or measured before).
#pragma once

#include <mpiddp/tensorboard.hpp>
#include <mpiddp/trainer.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/run_position.hpp"

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

/// One epoch's numbers as the metrics file writes them ("kind": "epoch"); TensorBoard's epoch/*
/// scalars are the same numbers.
nlohmann::json to_json(const EpochMetrics& m, int world_size);

class ProgressLog {
 public:
  using Note = std::function<void(const std::string&)>;
  /// `note`: rank 0's line sink (nullptr: none); `tokens_per_sample`: token data's block size (its
  /// lines report tokens/s too), else 0. Writes the run's options to TensorBoard, and a session
  /// start when `from` is a resumed position (its steps will be seen again).
  ProgressLog(RunLogs& logs, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
              const RunPosition& from, int64_t tokens_per_sample, Note note);

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
  const int64_t tokens_per_sample_;  ///< Task::tokens_per_sample() (0: samples alone)
  const bool active_;         ///< rank 0 with somewhere to write
  const int64_t log_steps_;   ///< a line every this many steps (0: none by steps)
  Note note_;
  Window window_;
};

}  // namespace mpiddp::detail
