// TensorBoard event files from C++: scalars and text that `tensorboard --logdir DIR` plots, written
// with Debian's protobuf (the schema is src/log/tensorboard.proto, TensorBoard's own field
// numbers) in TFRecord framing (length, masked CRC-32C of the length, event, masked CRC-32C of
// the event; Boost.CRC computes the CRC-32C). The Trainer writes one when
// TrainerOptions::tensorboard_dir is set; programs may write their own values through it too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mpiddp {

class SummaryWriter {
 public:
  /// Creates `dir` if needed and a new event file in it,
  /// events.out.tfevents.<unix seconds>.<host>.<pid>.<n> (TensorBoard reads every such file of
  /// a directory as one run). Throws mpiddp::Error (one line, naming the file) if it cannot.
  explicit SummaryWriter(const std::string& dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  /// A point of the scalar series `tag` (e.g. "train/loss") at `step`.
  void add_scalar(const std::string& tag, double value, int64_t step);
  /// Text (Markdown) under `tag`, shown in TensorBoard's Text tab.
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  /// A run (re)starting at `step`: TensorBoard drops values an earlier attempt wrote past it.
  void add_session_start(int64_t step);
  /// Each add_* writes its record and flushes it to the file, so a run killed at any time leaves
  /// every record it wrote readable. Throws mpiddp::Error if the write fails (disk full).
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpiddp
