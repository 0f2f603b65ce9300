#include "log/progress_log.hpp"

#include <mpiddp/diagnostics.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/flops.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/runtime.hpp>

#include <algorithm>
#include <array>
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

// "1.23 TFLOP/s", "45.67 GFLOP/s", "123.4 kFLOP/s": 3 or 4 significant digits.
std::string flops_text(double flops_per_s) {
  static constexpr std::array<const char*, 6> kPrefixes{"", "k", "M", "G", "T", "P"};
  double value = flops_per_s;
  size_t prefix = 0;
  while (value >= 999.95 && prefix + 1 < kPrefixes.size()) {  // 999.95 would print as 1000.0
    value /= 1000;
    ++prefix;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.*f %sFLOP/s", value >= 99.995 ? 1 : 2, value, kPrefixes[prefix]);
  return text;
}

// samples_text(), then where the model's FLOPs are known ", 1.23 TFLOP/s" and where the device's
// peak is too " (MFU 19.5%)".
std::string rate_text(const Rates& r) {
  char text[64];
  std::string out = samples_text(r.samples_per_s, r.tokens_per_s);
  if (r.flops_per_s > 0) {
    out += ", " + flops_text(r.flops_per_s);
    if (r.mfu > 0) {
      std::snprintf(text, sizeof text, " (MFU %.1f%%)", 100 * r.mfu);
      out += text;
    }
  }
  return out;
}

// One field of an epoch's record: its key in the metrics file (where `scalar`, also TensorBoard's
// epoch/<key>), the EpochMetrics member that holds it (a real number or a count) and when the
// record holds it. The one list of the record's fields: to_json and on_epoch read it. Rows in
// TensorBoard's order (the JSON object sorts its keys).
struct EpochField {
  enum class Presence { kAlways, kPositive, kNonNegative, kWithLossScale };
  const char* key;
  double EpochMetrics::*real;
  int64_t EpochMetrics::*count;
  Presence presence;
  bool scalar;

  bool present_in(const EpochMetrics& m) const {
    const double value = real ? m.*real : static_cast<double>(m.*count);
    switch (presence) {
      case Presence::kPositive:
        return value > 0;
      case Presence::kNonNegative:
        return value >= 0;  // -1: no test data, or no labels
      case Presence::kWithLossScale:
        return m.loss_scale > 0;
      case Presence::kAlways:
        break;
    }
    return true;
  }
};

using Presence = EpochField::Presence;
constexpr EpochField kEpochFields[] = {
    {"epoch", nullptr, &EpochMetrics::epoch, Presence::kAlways, false},
    {"steps", nullptr, &EpochMetrics::steps, Presence::kAlways, false},
    {"global_step", nullptr, &EpochMetrics::global_step, Presence::kAlways, false},
    {"train_loss", &EpochMetrics::train_loss, nullptr, Presence::kAlways, true},
    {"test_loss", &EpochMetrics::test_loss, nullptr, Presence::kNonNegative, true},
    {"test_accuracy", &EpochMetrics::test_accuracy, nullptr, Presence::kNonNegative, true},
    {"samples_per_s", &EpochMetrics::samples_per_s, nullptr, Presence::kAlways, true},
    {"tokens_per_s", &EpochMetrics::tokens_per_s, nullptr, Presence::kPositive, true},
    {"flops_per_s", &EpochMetrics::flops_per_s, nullptr, Presence::kPositive, true},
    {"mfu", &EpochMetrics::mfu, nullptr, Presence::kPositive, true},
    {"seconds", &EpochMetrics::seconds, nullptr, Presence::kAlways, true},
    {"lr", &EpochMetrics::lr, nullptr, Presence::kAlways, true},
    {"loss_scale", &EpochMetrics::loss_scale, nullptr, Presence::kPositive, true},
    {"overflow_steps", nullptr, &EpochMetrics::overflow_steps, Presence::kWithLossScale, false},
    {"skipped_steps", nullptr, &EpochMetrics::skipped_steps, Presence::kAlways, false},
    {"first_step_unix_s", &EpochMetrics::first_step_unix_s, nullptr, Presence::kPositive, false},
};

constexpr bool epoch_scalars_are_real() {
  for (const auto& f : kEpochFields) {
    if (f.scalar && !f.real) return false;
  }
  return true;
}
static_assert(epoch_scalars_are_real(), "a TensorBoard scalar of the epoch record reads a real-valued member");

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

// What samples/s makes tokens/s, FLOP/s and MFU with. FLOP/s counts model FLOPs (the option's
// figure, else the model's own): the recompute of activation checkpointing is not counted, as MFU's
// convention has it (PaLM, nanoGPT), so checkpointing shows as the MFU it costs. The job's peak is
// this rank's device's times the ranks: a job's devices are taken to be alike, and rank 0, which
// reports, names its own. No peak (no MFU) for the CPU or a device or precision flops.hpp lacks.
Throughput throughput_of(const TrainerOptions& o, const Model& model, int64_t tokens_per_sample,
                         const Runtime& runtime) {
  Throughput t;
  t.tokens_per_sample = tokens_per_sample;
  const bool own_count = o.flops_per_sample <= 0;  // the model's own figure (the built-in GPT: no convolution)
  t.flops_per_sample = own_count ? model.training_flops_per_sample(t.tokens_per_sample) : o.flops_per_sample;
  // A CUDA device without an index is the current one, which a tensor made there names.
  const c10::Device device = o.device.is_cuda() && !o.device.has_index()
                                 ? torch::empty({0}, torch::TensorOptions().device(o.device)).device()
                                 : o.device;
  const auto gpu = describe_gpu(device);
  if (!gpu) return t;
  // fp32 work runs on TF32 tensor cores where libtorch allows it (cuDNN's convolutions do by default,
  // and a user's model may convolve): against the plain fp32 peak MFU would then read high, so none.
  const auto& ctx = at::globalContext();
  const bool tf32 = o.precision == c10::kFloat && (ctx.allowTF32CuBLAS() || (ctx.allowTF32CuDNN() && !own_count));
  // The GPUs the job runs on (alike on every node): ranks that share a GPU share its peak.
  const int gpus = runtime.node_count() * std::min(runtime.local_size(), std::max(1, runtime.visible_gpus()));
  if (const auto peak = dense_peak_flops(gpu->name, o.precision); peak && !tf32) t.peak_flops_per_s = *peak * gpus;
  return t;
}

nlohmann::json to_json(const EpochMetrics& m, int world_size) {
  nlohmann::json j = {{"kind", "epoch"}, {"world_size", world_size}};
  for (const auto& f : kEpochFields) {
    if (!f.present_in(m)) continue;
    if (f.real) {
      j[f.key] = m.*f.real;
    } else {
      j[f.key] = m.*f.count;
    }
  }
  return j;
}

std::string samples_text(double samples_per_s, double tokens_per_s) {
  char text[384];  // a double's %.1f may take 300 characters
  std::snprintf(text, sizeof text, "%.1f samples/s", samples_per_s);
  std::string out = text;
  if (tokens_per_s > 0) {
    std::snprintf(text, sizeof text, " (%.0f tokens/s)", tokens_per_s);
    out += text;
  }
  return out;
}

std::string epoch_line(const EpochMetrics& m) {
  char text[384];  // a double's %.4f may take 300 characters
  std::snprintf(text, sizeof text, "epoch %lld: train loss %.4f", static_cast<long long>(m.epoch), m.train_loss);
  std::string out = text;
  if (m.test_loss >= 0) {
    std::snprintf(text, sizeof text, ", test loss %.4f", m.test_loss);
    out += text;
  }
  if (m.test_accuracy >= 0) {
    std::snprintf(text, sizeof text, ", test accuracy %.2f%%", 100.0 * m.test_accuracy);
    out += text;
  }
  out += ", " + samples_text(m.samples_per_s, m.tokens_per_s);
  std::snprintf(text, sizeof text, ", %.1f s, lr %.3g", m.seconds, m.lr);
  out += text;
  if (m.skipped_steps > 0) {
    std::snprintf(text, sizeof text, ", %lld step(s) skipped (NaN/Inf loss)", static_cast<long long>(m.skipped_steps));
    out += text;
  }
  if (m.loss_scale > 0) {
    std::snprintf(text, sizeof text, ", loss scale %g (%lld step(s) skipped for Inf/NaN gradients)", m.loss_scale,
                  static_cast<long long>(m.overflow_steps));
    out += text;
  }
  return out;
}

ProgressLog::ProgressLog(RunLogs& logs, const TrainerOptions& options, const Runtime& runtime, const RunPlan& plan,
                         const RunPosition& from, const Throughput& throughput, Note note)
    : logs_(logs),
      options_(options),
      plan_(plan),
      world_size_(runtime.size()),
      throughput_(throughput),
      active_(runtime.rank() == 0 && (note || logs.any())),
      log_steps_(options.log_every_steps < 0 ? std::max<int64_t>(1, plan.steps_per_epoch / 10)
                                             : options.log_every_steps),
      note_(std::move(note)) {
  if (logs_.tensorboard) {
    if (from.global_step > 0) logs_.tensorboard->add_session_start(from.global_step);  // a resumed run repeats steps
    logs_.tensorboard->add_text(
        "options",
        options_markdown(options.run_config.empty() ? "(TrainerOptions::run_config not set)" : options.run_config),
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
  const Rates r = throughput_.at(rate * static_cast<double>(o.samples_per_step() * world_size_));
  const double loss_mean = window_.loss / static_cast<double>(window_.steps);
  const int64_t left_in_epoch = plan_.steps_per_epoch - p.step_in_epoch, left = plan_.total_steps - p.global_step;
  if (note_) {
    char text[384];
    std::snprintf(text, sizeof text,
                  "epoch %lld/%lld, step %lld/%lld (%d%%): loss %.4f (rank 0, mean of the last %lld steps), "
                  "%s, ETA epoch %s, run %s",
                  static_cast<long long>(p.epoch + 1), static_cast<long long>(plan_.epochs),
                  static_cast<long long>(p.step_in_epoch), static_cast<long long>(plan_.steps_per_epoch),
                  static_cast<int>(100 * p.step_in_epoch / plan_.steps_per_epoch), loss_mean,
                  static_cast<long long>(window_.steps), rate_text(r).c_str(),
                  clock_text(static_cast<double>(left_in_epoch) / rate).c_str(),
                  clock_text(static_cast<double>(left) / rate).c_str());
    note_(text);
  }
  nlohmann::json line = {{"kind", "log"},
                         {"epoch", p.epoch + 1},
                         {"step", p.step_in_epoch},
                         {"global_step", p.global_step},
                         {"train_loss", loss_mean},
                         {"window_steps", window_.steps},
                         {"samples_per_s", r.samples_per_s},
                         {"lr", p.lr}};
  if (r.tokens_per_s > 0) line["tokens_per_s"] = r.tokens_per_s;
  if (r.flops_per_s > 0) line["flops_per_s"] = r.flops_per_s;
  if (r.mfu > 0) line["mfu"] = r.mfu;
  logs_.line(line);
  logs_.scalar("train/loss", loss_mean, p.global_step);
  logs_.scalar("train/samples_per_s", r.samples_per_s, p.global_step);
  if (r.tokens_per_s > 0) logs_.scalar("train/tokens_per_s", r.tokens_per_s, p.global_step);
  if (r.flops_per_s > 0) logs_.scalar("train/flops_per_s", r.flops_per_s, p.global_step);
  if (r.mfu > 0) logs_.scalar("train/mfu", r.mfu, p.global_step);
  logs_.scalar("train/lr", p.lr, p.global_step);
  window_ = Window{};
}

void ProgressLog::on_epoch(const EpochMetrics& m) {
  logs_.line(to_json(m, world_size_));
  // The same numbers as TensorBoard scalars epoch/<key>, at the epoch's last global step.
  for (const auto& f : kEpochFields) {
    if (f.scalar && f.present_in(m)) logs_.scalar(std::string("epoch/") + f.key, m.*f.real, m.global_step);
  }
}

}  // namespace mpiddp::detail
