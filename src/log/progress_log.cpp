#include "log/progress_log.hpp"

#include <mpiddp/error.hpp>

#include <algorithm>
#include <cstdio>

namespace mpiddp::detail {

namespace {

// "1:02:03" or "4:05" for a duration in seconds.
std::string clock_text(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

// "123.4 samples/s", or for token data "123.4 samples/s (31590 tokens/s)".
std::string rate_text(double samples_per_s, double tokens_per_s) {
  char text[96];
  if (tokens_per_s > 0) {
    std::snprintf(text, sizeof text, "%.1f samples/s (%.0f tokens/s)", samples_per_s, tokens_per_s);
  } else {
    std::snprintf(text, sizeof text, "%.1f samples/s", samples_per_s);
  }
  return text;
}

// The run's options as TensorBoard text: a Markdown table of a JSON object (what the CLI stores),
// else the text as it is.
std::string options_markdown(const std::string& config) {
  const auto j = nlohmann::json::parse(config, nullptr, false);
  if (!j.is_object()) return config;
  std::string text = "| option | value |\n|---|---|\n";
  for (const auto& [key, value] : j.items()) {
    text += "| " + key + " | " + (value.is_string() ? value.get<std::string>() : value.dump()) + " |\n";
  }
  return text;
}

}  // namespace

RunLogs::RunLogs(const TrainerOptions& o, int rank) {
  if (rank != 0) return;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, std::ios::app);
    MPIDDP_CHECK(metrics.good(), "cannot write the metrics file '" + o.metrics_path + "'");
  }
  if (!o.tensorboard_dir.empty()) tensorboard = std::make_unique<SummaryWriter>(o.tensorboard_dir);
}

void RunLogs::line(const nlohmann::json& j) {
  if (metrics.is_open()) metrics << j.dump() << std::endl;
}

void RunLogs::scalar(const std::string& tag, double value, int64_t step) {
  if (tensorboard) tensorboard->add_scalar(tag, value, step);
}

nlohmann::json to_json(const EpochMetrics& m, int world_size) {
  nlohmann::json j = {{"kind", "epoch"}, {"epoch", m.epoch}, {"steps", m.steps}, {"global_step", m.global_step},
                      {"train_loss", m.train_loss}, {"samples_per_s", m.samples_per_s}, {"seconds", m.seconds},
                      {"lr", m.lr}, {"world_size", world_size}, {"skipped_steps", m.skipped_steps}};
  if (m.first_step_unix_s > 0) j["first_step_unix_s"] = m.first_step_unix_s;
  if (m.test_loss >= 0) j["test_loss"] = m.test_loss;
  if (m.test_accuracy >= 0) j["test_accuracy"] = m.test_accuracy;
  if (m.tokens_per_s > 0) j["tokens_per_s"] = m.tokens_per_s;
  if (m.loss_scale > 0) {
    j["loss_scale"] = m.loss_scale;
    j["overflow_steps"] = m.overflow_steps;
  }
  return j;
}

ProgressLog::ProgressLog(RunLogs& logs, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
                         const RunPosition& from, int64_t tokens_per_sample, Note note)
    : logs_(logs),
      options_(options),
      plan_(plan),
      world_size_(runtime.size()),
      tokens_per_sample_(tokens_per_sample),
      active_(runtime.rank() == 0 && (note || logs.any())),
      log_steps_(options.log_every_steps < 0 ? std::max<int64_t>(1, plan.steps_per_epoch / 10)
                                             : options.log_every_steps),
      note_(std::move(note)) {
  if (logs_.tensorboard) {
    if (from.global_step > 0) logs_.tensorboard->add_session_start(from.global_step);  // a resumed run repeats steps
    logs_.tensorboard->add_text("options",
                                options_markdown(options.run_config.empty() ? "(TrainerOptions::run_config not set)"
                                                                            : options.run_config),
                                from.global_step);
  }
}

void ProgressLog::maybe_report(const RunPosition& p) {
  const auto& o = options_;
  const auto now = std::chrono::steady_clock::now();
  const double span = std::chrono::duration<double>(now - window_.since).count();
  const bool by_steps = log_steps_ > 0 && p.step_in_epoch % log_steps_ == 0;
  const bool by_time = o.log_every_seconds > 0 && span >= o.log_every_seconds;
  // No line at an epoch's or the run's end: the epoch's own line follows.
  if (!(by_steps || by_time) || span < o.log_min_gap_seconds || !plan_.epoch_running(p)) return;
  const double rate = static_cast<double>(window_.steps) / std::max(span, 1e-9);  // steps/s
  const double samples_per_s = rate * static_cast<double>(o.samples_per_step() * world_size_);
  const double tokens_per_s = samples_per_s * static_cast<double>(tokens_per_sample_);
  const double loss_mean = window_.loss / static_cast<double>(window_.steps);
  const int64_t left_in_epoch = plan_.steps_per_epoch - p.step_in_epoch, left = plan_.total_steps - p.global_step;
  if (note_) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "epoch %lld/%lld, step %lld/%lld (%d%%): loss %.4f (rank 0, mean of the last %lld steps), "
                  "%s, ETA epoch %s, run %s",
                  static_cast<long long>(p.epoch + 1), static_cast<long long>(plan_.epochs),
                  static_cast<long long>(p.step_in_epoch), static_cast<long long>(plan_.steps_per_epoch),
                  static_cast<int>(100 * p.step_in_epoch / plan_.steps_per_epoch), loss_mean,
                  static_cast<long long>(window_.steps), rate_text(samples_per_s, tokens_per_s).c_str(),
                  clock_text(static_cast<double>(left_in_epoch) / rate).c_str(),
                  clock_text(static_cast<double>(left) / rate).c_str());
    note_(text);
  }
  nlohmann::json line = {{"kind", "log"}, {"epoch", p.epoch + 1}, {"step", p.step_in_epoch},
                         {"global_step", p.global_step}, {"train_loss", loss_mean}, {"window_steps", window_.steps},
                         {"samples_per_s", samples_per_s}, {"lr", p.lr}};
  if (tokens_per_s > 0) line["tokens_per_s"] = tokens_per_s;
  logs_.line(line);
  logs_.scalar("train/loss", loss_mean, p.global_step);
  logs_.scalar("train/samples_per_s", samples_per_s, p.global_step);
  if (tokens_per_s > 0) logs_.scalar("train/tokens_per_s", tokens_per_s, p.global_step);
  logs_.scalar("train/lr", p.lr, p.global_step);
  window_ = Window{};
}

void ProgressLog::on_epoch(const EpochMetrics& m) {
  const auto j = to_json(m, world_size_);
  logs_.line(j);
  // The same numbers as TensorBoard scalars epoch/<key>, at the epoch's last global step.
  for (const char* key : {"train_loss", "test_loss", "test_accuracy", "samples_per_s", "tokens_per_s", "seconds", "lr",
                          "loss_scale"}) {
    if (j.contains(key)) logs_.scalar(std::string("epoch/") + key, j[key].get<double>(), m.global_step);
  }
}

}  // namespace mpiddp::detail
