// `mpiddp train`: DDP training of a built-in model, a TorchScript file or a .pt2 program on a dataset
// (HDF5 samples or llm.c token shards), a thin client of mpiddp::Trainer. Options come from the
// command line, then --config FILE, then MPIDDP_* variables (see cli.hpp).
#include <mpiddp/allocator.hpp>
#include <mpiddp/backends.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/optim.hpp>
#include <mpiddp/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <mpiddp/models.hpp>

#include "app/cli.hpp"
#include "app/option_table.hpp"
#include "common/text.hpp"
#include "log/progress_log.hpp"
#include "models/hf_gpt2.hpp"
#include "zero/model_sharding.hpp"

namespace mpiddp::app {

namespace {

// What the command line says, before it becomes a model, an optimizer and TrainerOptions. Its
// initial values are the options' defaults (TrainerOptions' own for the library's fields).
struct TrainConfig {
  std::string config_file, model = "cnn", loss = "auto", optimizer = "adam", schedule = "none", device = "cpu";
  std::string backend = "mpi", on_nan = "stop", compression = "none", log_every = "auto", precision = "fp32";
  std::string betas = "0.9,0.999", decay_params = "all", init_from, timeline;
  double lr = 0, momentum = 0, weight_decay = 0, gamma = 0.1, min_lr = 0;
  GptConfig gpt;
  double bucket_mb = 0, first_bucket_mb = 1, cache_mb = 512;
  int64_t step_size = 1, warmup_steps = 0;
  int threads = 0;
  bool no_shuffle = false, drop_last = false, dry_run = false, deterministic = false;
  bool zero_no_prefetch = false, zero_keep_gathered = false;
  TrainerOptions t;
};

using Row = OptionRow<TrainConfig>;

// The optimizers' names, as the library's table lists them.
std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const auto& o : optimizers()) names.push_back(o.name);
  return names;
}

// The optimizers that read `mpiddp train`'s flag `parameter` (OptimizerSpec::cli_parameters).
std::vector<std::string> optimizers_taking(const std::string& parameter) {
  std::vector<std::string> names;
  for (const auto& o : optimizers()) {
    if (std::count(o.cli_parameters.begin(), o.cli_parameters.end(), parameter)) names.push_back(o.name);
  }
  return names;
}

// --lr auto: each optimizer's own default learning rate.
std::string auto_lr_text() {
  std::vector<std::string> each;
  for (const auto& o : optimizers()) {
    std::ostringstream lr;
    lr << o.default_lr;
    each.push_back(lr.str() + " for " + o.name);
  }
  return "learning rate (auto: " + detail::joined(each, ", ") + ")";
}

// The model, its data and its loss.
std::vector<Row> model_options() {
  using C = TrainConfig;
  return {
      option<C>(
          "config", [](C & c) -> auto& { return c.config_file; }, "read options from this file (name = value lines)",
          kNoDefault, std::vector<std::string>{}),
      option<C>(
          "model", [](C & c) -> auto& { return c.model; },
          "linear | mlp | cnn (PyTorch's MNIST example net) | gpt (nanoGPT's GPT; token data) | FILE.pt (a "
          "TorchScript module saved from Python) | FILE.pt2 (a torch.export program, torch.export.save)"),
      option<C>(
          "loss", [](C & c) -> auto& { return c.loss; },
          "auto (cross-entropy for class labels and tokens, mse for regression) | cross-entropy | mse | model (a "
          "TorchScript or .pt2 forward(inputs, targets) returns (outputs, loss), as nanoGPT's GPT)"),
      option<C>(
          "data", [](C & c) -> auto& { return c.t.data; },
          "training set: an HDF5 file (see `mpiddp data`) or token shards (llm.c's .bin; names and globs, "
          "comma-separated)",
          kNoDefault),
      option<C>(
          "test-data", [](C & c) -> auto& { return c.t.test_data; },
          "test set, evaluated after each epoch and at the run's end", kNoDefault),
      option<C>(
          "data-format", [](C & c) -> auto& { return c.t.data_format; },
          detail::joined(data_format_names(), " | ") +
              " (auto: HDF5 for .h5/.hdf5, else llm.c token shards; raw-uint16: nanoGPT's headerless train.bin)"),
      option<C>(
          "block-size", [](C & c) -> auto& { return c.gpt.block_size; },
          "token data: tokens per sample (windows of T+1 at stride T); gpt: the context length"),
      option<C>(
          "vocab-size", [](C & c) -> auto& { return c.gpt.vocab_size; },
          "gpt: vocabulary (every token must be below it)"),
      option<C>(
          "n-layer", [](C & c) -> auto& { return c.gpt.n_layer; }, "gpt: transformer blocks"),
      option<C>(
          "n-head", [](C & c) -> auto& { return c.gpt.n_head; }, "gpt: attention heads"),
      option<C>(
          "n-embd", [](C & c) -> auto& { return c.gpt.n_embd; }, "gpt: width"),
      option<C>(
          "dropout", [](C & c) -> auto& { return c.gpt.dropout; }, "gpt: dropout", shown_as("0")),
      option<C>(
          "bias", [](C & c) -> auto& { return c.gpt.bias; }, "gpt: biases in Linears and LayerNorms (true | false)",
          shown_as("true")),
      option<C>(
          "init-from", [](C & c) -> auto& { return c.init_from; },
          "start from this state_dict (torch.save(model.state_dict()) or `mpiddp export`) instead of a fresh model; "
          "gpt: or from a Hugging Face GPT-2 directory (config.json + model.safetensors), whose shape is the GPT's",
          kNoDefault),
  };
}

// Steps, the optimizer and its schedule.
std::vector<Row> step_options() {
  using C = TrainConfig;
  return {
      option<C>(
          "grad-accum", [](C & c) -> auto& { return c.t.grad_accum; },
          "micro-batches per optimizer step (each loss / K; gradients reduced only in the last)"),
      option<C>(
          "zero-stage", [](C & c) -> auto& { return c.t.zero_stage; },
          "0 (DDP) | 1 (ZeRO: each rank keeps 1/N of the optimizer state) | 2 (and 1/N of the gradients) | 3 "
          "(and 1/N of the parameters of the model's units: gpt blocks, mlp and cnn layers)"),
      flag_switch<C>(
          "zero-no-prefetch", [](C & c) -> auto& { return c.zero_no_prefetch; },
          "ZeRO stage 3: gather each unit only when it runs (no all-gather in flight beside compute)", "zero_prefetch",
          [](bool on) { return nlohmann::json(!on); }),
      flag_switch<C>(
          "zero-keep-gathered", [](C & c) -> auto& { return c.zero_keep_gathered; },
          "ZeRO stage 3: keep each unit gathered from its forward to its backward (one all-gather less "
          "per unit, more memory)",
          "zero_reshard_after_forward", [](bool on) { return nlohmann::json(!on); }),
      flag_switch<C>(
          "dry-run", [](C & c) -> auto& { return c.dry_run; },
          "check the options, data and model, print the memory plan per rank and exit without training"),
      flag_switch<C>(
          "activation-checkpointing", [](C & c) -> auto& { return c.t.activation_checkpointing; },
          "recompute each block's activations in backward instead of keeping them (gpt: per "
          "transformer block; about a third more compute, the same results)"),
      option<C>(
          "epochs", [](C & c) -> auto& { return c.t.epochs; },
          "passes over the training set (0: as many as --max-steps takes, else 1)"),
      option<C>(
          "max-steps", [](C & c) -> auto& { return c.t.max_steps; }, "stop after this many steps in all (0: no cap)"),
      option<C>(
          "batch-size", [](C & c) -> auto& { return c.t.batch_size; }, "samples per rank per step"),
      option<C>(
          "lr", [](C & c) -> auto& { return c.lr; }, auto_lr_text(), shown_as("auto")),
      option<C>(
          "optimizer", [](C & c) -> auto& { return c.optimizer; },
          detail::joined(optimizer_names(), " | ") + " (the default trains well without tuning)"),
      option<C>(
          "momentum", [](C & c) -> auto& { return c.momentum; }, "sgd momentum"),
      option<C>(
          "weight-decay", [](C & c) -> auto& { return c.weight_decay; }, "weight decay"),
      option<C>(
          "weight-decay-params", [](C & c) -> auto& { return c.decay_params; },
          "all | matrices (nanoGPT's groups: only tensors of 2+ dimensions decay)"),
      option<C>(
          "betas", [](C & c) -> auto& { return c.betas; }, detail::joined(optimizers_taking("betas"), "/") + ": B1,B2"),
      option<C>(
          "min-lr", [](C & c) -> auto& { return c.min_lr; }, "cosine schedule: the rate it decays to", shown_as("0")),
      option<C>(
          "lr-schedule", [](C & c) -> auto& { return c.schedule; }, detail::joined(lr_schedule_names(), " | ")),
      option<C>(
          "step-size", [](C & c) -> auto& { return c.step_size; }, "step schedule: epochs between decays"),
      option<C>(
          "gamma", [](C & c) -> auto& { return c.gamma; }, "step schedule: decay factor"),
      option<C>(
          "warmup-steps", [](C & c) -> auto& { return c.warmup_steps; },
          "linear warmup over this many steps (cosine: nanoGPT's get_lr, (step+1)/(N+1) then decay to --min-lr)"),
      option<C>(
          "seed", [](C & c) -> auto& { return c.t.seed; }, "seed of the initial model and the sampler's shuffle"),
      flag_switch<C>(
          "no-shuffle", [](C & c) -> auto& { return c.no_shuffle; }, "keep the dataset's order", "shuffle",
          [](bool on) { return nlohmann::json(!on); }),
      flag_switch<C>(
          "drop-last", [](C & c) -> auto& { return c.drop_last; },
          "drop the tail instead of padding shards to equal length"),
  };
}

// Devices, data reading, communication and records.
std::vector<Row> run_options() {
  using C = TrainConfig;
  return {
      option<C>(
          "device", [](C & c) -> auto& { return c.device; }, "cpu | cuda"),
      option<C>(
          "backend", [](C & c) -> auto& { return c.backend; }, backend_names(" | ")),
      flag_switch<C>(
          "deterministic", [](C & c) -> auto& { return c.deterministic; },
          "cuda: deterministic kernels (cuDNN's deterministic algorithms, PyTorch's deterministic "
          "mode), so that a run repeats bitwise and a resumed run ends where the whole run ends; "
          "somewhat slower (CPU kernels are deterministic already)"),
      option<C>(
          "threads", [](C & c) -> auto& { return c.threads; },
          "intra-op threads per rank (0: the cores each rank owns)"),
      option<C>(
          "metrics", [](C & c) -> auto& { return c.t.metrics_path; },
          "append JSON lines to this file (rank 0): one per epoch (\"kind\": \"epoch\") and one per progress "
          "line (\"kind\": \"log\")",
          kNoDefault),
      option<C>(
          "tensorboard", [](C & c) -> auto& { return c.t.tensorboard_dir; },
          "write TensorBoard event files to this directory (rank 0): train/* scalars per progress line, epoch/* "
          "per epoch, the options as text",
          kNoDefault),
      option<C>(
          "flops-per-sample", [](C & c) -> auto& { return c.t.flops_per_sample; },
          "model FLOPs of one sample's forward and backward, for FLOP/s and MFU (default: the built-in GPT's "
          "own; other models: none)",
          shown_as("0")),
      option<C>(
          "cache-mb", [](C & c) -> auto& { return c.cache_mb; },
          "read a dataset into memory once when it is at most this size (MiB; 0: read every batch from the "
          "file)",
          {}, std::vector<std::string>{"cache_bytes"}),
      option<C>(
          "prefetch", [](C & c) -> auto& { return c.t.prefetch_batches; },
          "batches a reader thread prepares ahead of the step (0: read on the training thread; uncached data "
          "with a parallel HDF5 is then read by one collective MPI-IO read per step)",
          {}, std::vector<std::string>{"prefetch_batches"}),
      option<C>(
          "bucket-cap-mb", [](C & c) -> auto& { return c.bucket_mb; },
          "DDP bucket cap (MiB); 0: 25, under ZeRO the gradient's size / 16 from 1 to 25"),
      option<C>(
          "first-bucket-cap-mb", [](C & c) -> auto& { return c.first_bucket_mb; }, "DDP first bucket cap (MiB)"),
      option<C>(
          "compression", [](C & c) -> auto& { return c.compression; },
          "gradients on the wire: " + detail::joined(compression_names(), " | ")),
      option<C>(
          "timeline", [](C & c) -> auto& { return c.timeline; },
          "per-rank Chrome trace of DDP (FILE -> FILE.rank<r>.json)", kNoDefault),
      option<C>(
          "profile", [](C & c) -> auto& { return c.t.profile_path; },
          "PyTorch's profiler over --profile-steps steps: a per-rank Chrome trace of operators and, on CUDA, "
          "kernels with their GPU time (FILE -> FILE.rank<r>.json)",
          kNoDefault, std::vector<std::string>{"profile_path"}),
      option<C>(
          "profile-from", [](C & c) -> auto& { return c.t.profile_first_step; },
          "--profile starts after this many global steps", {}, std::vector<std::string>{"profile_first_step"}),
      option<C>(
          "profile-steps", [](C & c) -> auto& { return c.t.profile_steps; }, "steps --profile records", {},
          std::vector<std::string>{"profile_steps"}),
  };
}

// How the run is kept and controlled: snapshots, faults, progress lines, precision, clipping.
std::vector<Row> run_control_options() {
  using C = TrainConfig;
  return {
      option<C>(
          "snapshot-dir", [](C & c) -> auto& { return c.t.snapshot_dir; },
          "write snapshots here (rank 0; HDF5, latest.h5 names the newest)", kNoDefault),
      option<C>(
          "save-every", [](C & c) -> auto& { return c.t.save_every; }, "snapshot every N epochs (0: only at the end)"),
      option<C>(
          "save-every-steps", [](C & c) -> auto& { return c.t.save_every_steps; },
          "also snapshot every N steps (0: off)"),
      option<C>(
          "keep", [](C & c) -> auto& { return c.t.keep; }, "snapshots kept in --snapshot-dir (0: all)"),
      option<C>(
          "resume", [](C & c) -> auto& { return c.t.resume; },
          "auto (newest valid snapshot in --snapshot-dir, if any) | never | a snapshot file"),
      option<C>(
          "on-nan", [](C & c) -> auto& { return c.on_nan; },
          "NaN/Inf loss: stop (an error naming the step) | skip (drop that step's update)"),
      option<C>(
          "log-every", [](C & c) -> auto& { return c.log_every; },
          "progress lines within an epoch (rank 0): auto (every tenth of an epoch or 30 s, whichever first, "
          "at least 2 s apart) | N (every N steps) | Ns (every N seconds) | 0 (none)",
          {}, std::vector<std::string>{"log_every_steps", "log_every_seconds", "log_min_gap_seconds"}),
      option<C>(
          "precision", [](C & c) -> auto& { return c.precision; },
          "fp32 | bf16 (autocast: CPU and CUDA) | fp16 (autocast + dynamic loss scaling: CUDA; CPU with "
          "libtorch 2.x)"),
      option<C>(
          "loss-scale", [](C & c) -> auto& { return c.t.loss_scaling.init_scale; },
          "fp16: the initial loss scale (halved on a step with Inf/NaN gradients, doubled after 2000 good "
          "steps)",
          shown_as("65536"), std::vector<std::string>{"loss_scaling.init_scale"}),
      option<C>(
          "clip-grad-norm", [](C & c) -> auto& { return c.t.clip_grad_norm; },
          "scale the averaged gradients to a global L2 norm of at most X before each update (0: off)", shown_as("0")),
  };
}

// Every `mpiddp train` option, once: flag, value and default, help, the TrainerOptions fields whose
// rules name it (the library owns the rules: check_trainer_options(); the CLI only names them), and its key in
// the run's record (the snapshot's "config").
const std::vector<Row>& train_options() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> r = model_options();
    for (auto part : {step_options(), run_options(), run_control_options()})
      r.insert(r.end(), part.begin(), part.end());
    r.front().record = nullptr;  // --config names where options came from, not an option of the run
    return r;
  }();
  return rows;
}

// The flag that sets each TrainerOptions field, for the library's messages.
std::string flag_of(const std::string& field) {
  const auto flag = flag_for_field(train_options(), field);
  return flag.empty() ? "TrainerOptions::" + field : flag;
}

// The LR schedule's parameters from their flags (--min-lr as a factor of --lr), and the flag of each
// field, for the library's messages.
LrScheduleParams schedule_params(const TrainConfig& c) {
  return {c.step_size, c.gamma, c.warmup_steps, c.min_lr / c.lr};
}
std::string schedule_flag_of(const std::string& field) {
  if (field == "min_factor") return "--min-lr / --lr";
  std::string flag = "--" + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// "B1,B2" as Adam's betas.
std::tuple<double, double> betas_of(const std::string& text) {
  std::smatch m;
  static const std::regex kPair(
      R"(\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*,\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*)");
  MPIDDP_CHECK(std::regex_match(text, m, kPair), "--betas takes two numbers B1,B2 (e.g. 0.9,0.95), got '" + text + "'");
  const double b1 = std::stod(m[1]), b2 = std::stod(m[2]);
  MPIDDP_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "--betas must each be in [0, 1), got '" + text + "'");
  return {b1, b2};
}

// The flags that are the CLI's own (not TrainerOptions fields): their rules live here.
void check_cli_flags(const Runtime& runtime, const TrainConfig& c) {
  const auto* optimizer = find_optimizer(c.optimizer);
  MPIDDP_CHECK(optimizer, detail::unknown_name("--optimizer", c.optimizer, optimizer_names()));
  MPIDDP_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be > 0, got " + std::to_string(c.lr));
  MPIDDP_CHECK(c.momentum >= 0 && c.weight_decay >= 0, "--momentum and --weight-decay must be >= 0");
  check_lr_schedule_name(c.schedule, "--lr-schedule");
  check_lr_schedule_params(schedule_params(c), schedule_flag_of);
  MPIDDP_CHECK(c.decay_params == "all" || c.decay_params == "matrices",
               "unknown --weight-decay-params '" + c.decay_params + "' (all, matrices)");
  const auto& takes = optimizer->cli_parameters;
  MPIDDP_CHECK(std::find(takes.begin(), takes.end(), "betas") != takes.end() || c.betas == "0.9,0.999",
               "--betas applies to " + detail::joined(optimizers_taking("betas"), " and ") + ", not " + c.optimizer);
  betas_of(c.betas);  // throws on a malformed pair
  if (c.model == "gpt") c.gpt.validate();
  MPIDDP_CHECK(c.init_from.empty() || std::filesystem::is_regular_file(c.init_from) ||
                   std::filesystem::is_directory(c.init_from),
               "--init-from: state_dict file or Hugging Face directory '" + c.init_from + "' does not exist");
  MPIDDP_CHECK(c.loss == "auto" || c.loss == "cross-entropy" || c.loss == "mse" || c.loss == "model",
               "unknown --loss '" + c.loss + "' (auto, cross-entropy, mse, model)");
  MPIDDP_CHECK(c.device == "cpu" || c.device == "cuda", "unknown --device '" + c.device + "' (cpu, cuda)");
  MPIDDP_CHECK(c.threads >= 0, "--threads must be >= 0");
  check_backend(c.backend, c.device == "cuda" ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU), runtime,
                "--device " + c.device);
  MPIDDP_CHECK(c.on_nan == "stop" || c.on_nan == "skip", "unknown --on-nan '" + c.on_nan + "' (stop, skip)");
  MPIDDP_CHECK(std::regex_match(c.log_every, std::regex(R"(auto|[0-9]+|[0-9]+(\.[0-9]+)?s)")),
               "--log-every takes auto, N (steps), Ns (seconds) or 0 (off), got '" + c.log_every + "'");
  MPIDDP_CHECK(c.bucket_mb >= 0 && c.first_bucket_mb > 0,
               "--bucket-cap-mb must be >= 0 (0: the rule) and --first-bucket-cap-mb > 0");
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, const Model& model) {
  OptimizerSettings s;
  s.lr = c.lr;
  s.momentum = c.momentum;
  s.weight_decay = c.weight_decay;
  s.betas = betas_of(c.betas);
  s.decay_matrices_only = c.decay_params == "matrices";
  return find_optimizer(c.optimizer)->make(parameters(model), s);
}

// The run's record (the snapshot's "config"): every option's value, the threads each rank used and
// the world size; the GPT's shape as `mpiddp generate` reads it.
std::string config_json(const TrainConfig& c, int threads, int world_size) {
  auto j = record(train_options(), c);
  j["threads"] = threads;
  j["world_size"] = world_size;
  if (c.model == "gpt") j["gpt"] = nlohmann::json::parse(c.gpt.to_json());
  return j.dump();
}

}  // namespace

namespace {

// ---- --init-from DIR: a Hugging Face GPT-2 (models/hf_gpt2.hpp) ----
// Its config.json is the GPT's shape: a shape flag given otherwise is an error, not overridden.
// The dropout stays the run's own (--dropout, as nanoGPT's fine-tuning), not the checkpoint's.
// Every rank reads the directory, config.json here and the weights in make_trainer, each in a local
// phase whose errors the ranks agree on (one line from rank 0, every rank exits).
bool is_hf_dir(const std::string& init_from) { return !init_from.empty() && std::filesystem::is_directory(init_from); }

void take_hf_gpt2_shape(TrainConfig& c, const po::variables_map& vm) {
  if (!is_hf_dir(c.init_from)) return;
  MPIDDP_CHECK(c.model == "gpt",
               "--init-from '" + c.init_from + "' is a Hugging Face directory: it starts --model gpt, not " + c.model);
  GptConfig hf;
  try {
    hf = read_hf_gpt2_config(c.init_from);
  } catch (const Error& e) {
    MPIDDP_THROW("--init-from: " + e.message());
  }
  const std::vector<std::tuple<std::string, nlohmann::json, nlohmann::json>> shape = {
      {"block-size", c.gpt.block_size, hf.block_size},
      {"vocab-size", c.gpt.vocab_size, hf.vocab_size},
      {"n-layer", c.gpt.n_layer, hf.n_layer},
      {"n-head", c.gpt.n_head, hf.n_head},
      {"n-embd", c.gpt.n_embd, hf.n_embd},
      {"bias", c.gpt.bias, hf.bias}};
  for (const auto& [flag, given, theirs] : shape) {
    MPIDDP_CHECK(vm[flag].defaulted() || given == theirs,
                 "--" + flag + " " + given.dump() + " disagrees with " + c.init_from + "/config.json (" +
                     theirs.dump() + "): the checkpoint's shape is the GPT's, leave the flag out");
  }
  hf.dropout = c.gpt.dropout;
  c.gpt = hf;
}
// ---- end of --init-from DIR ----

// The parsed options as TrainerOptions (c.t) and the rest of the run; the threads each rank uses.
int apply_options(TrainConfig& c, const po::variables_map& vm, const Runtime& runtime) {
  auto& t = c.t;
  t.shuffle = !c.no_shuffle;
  t.drop_last = c.drop_last;
  t.zero.prefetch = !c.zero_no_prefetch;
  t.zero.reshard_after_forward = !c.zero_keep_gathered;
  t.zero.whole_at_end = false;  // nothing reads the model after fit(): at stage 3 it never exists whole
  if (const auto* optimizer = find_optimizer(c.optimizer); optimizer && vm["lr"].defaulted()) {
    c.lr = optimizer->default_lr;  // an unknown name fails in check_cli_flags
  }
  take_hf_gpt2_shape(c, vm);
  check_cli_flags(runtime, c);
  t.ddp.bucket_cap_bytes = static_cast<int64_t>(c.bucket_mb * (1 << 20));
  t.ddp.first_bucket_cap_bytes = static_cast<int64_t>(c.first_bucket_mb * (1 << 20));
  t.ddp.compression = parse_compression(c.compression, "--compression");
  t.ddp.timeline_path = c.timeline;
  t.cache_bytes = static_cast<int64_t>(c.cache_mb * (1 << 20));
  t.skip_nonfinite_loss = c.on_nan == "skip";
  t.precision = parse_precision(c.precision);
  if (c.log_every != "auto") {  // explicit: exactly that trigger, no minimum gap
    const bool seconds = c.log_every.back() == 's';
    t.log_every_steps = seconds ? 0 : std::stoll(c.log_every);
    t.log_every_seconds = seconds ? std::stod(c.log_every) : 0;
    t.log_min_gap_seconds = 0;
  }
  if (c.device == "cuda") t.device = runtime.device();
  t.lr_schedule = lr_schedule_named(c.schedule, schedule_params(c), "--lr-schedule");
  t.block_size = c.gpt.block_size;
  if (c.loss == "cross-entropy") t.loss = cross_entropy_loss();
  if (c.loss == "mse") t.loss = mse_loss();
  t.model_loss = c.loss == "model";
  const int threads = c.threads > 0 ? c.threads : fair_share_of_cores(runtime.local_size());
  t.run_config = config_json(c, threads, runtime.size());
  check_trainer_options(t, flag_of, runtime.rank());
  return threads;
}

// The model (fresh, or from --init-from) for the training set the Trainer opens, its optimizer and
// the Trainer. Local: no collective.
std::unique_ptr<Trainer> make_trainer(const TrainConfig& c, int threads, Runtime& runtime, ProcessGroup& pg) {
  torch::set_num_threads(threads);
  if (c.deterministic) use_deterministic_kernels();
  torch::manual_seed(
      c.t.seed);  // the same initial model on every rank (DDP, or stage 3's ZeRO, broadcasts rank 0's anyway)
  const auto make = [&c](const DatasetInfo& data) {
    // ZeRO stage 3 initialises a deferred model unit by unit: it is never whole on a rank (a
    // state_dict to start from is read whole, so that one is made whole).
    const bool defer = detail::shards_units(c.t.zero_stage) && c.init_from.empty();
    auto model = make_model(c.model, data, c.gpt, defer ? ParameterInit::kDeferred : ParameterInit::kNow);
    if (!c.init_from.empty()) {
      try {
        load_named(*model,
                   is_hf_dir(c.init_from) ? read_hf_gpt2_state(c.init_from, c.gpt) : read_state_dict(c.init_from));
      } catch (const Error& e) {
        MPIDDP_THROW("--init-from '" + c.init_from + "': " + e.message());
      }
    }
    return ModelAndOptimizer{model, make_optimizer(c, *model)};
  };
  return std::make_unique<Trainer>(runtime, pg, make, c.t);
}

void print_start(Trainer& trainer, const TrainConfig& c, int threads, const Runtime& runtime) {
  int64_t params = 0;
  for (const auto& p : parameters(trainer.model())) params += p.numel();  // a tied weight once
  std::printf(
      "mpiddp train: model %s (%lld parameters), %d rank(s) x batch %lld, %d thread(s) per rank, backend %s, device "
      "%s\n",
      trainer.model().description().c_str(), static_cast<long long>(params), runtime.size(),
      static_cast<long long>(c.t.batch_size), threads, c.backend.c_str(), c.device.c_str());
  for (const auto& note : trainer.model().notes()) std::printf("%s\n", note.c_str());
  std::fflush(stdout);
}

void print_epoch(const EpochMetrics& m, const std::vector<std::string>& lines) {
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("%s\n", detail::epoch_line(m).c_str());  // the progress log's text of the epoch's numbers
  std::fflush(stdout);
}

}  // namespace

int run_train(Runtime& runtime, const std::vector<std::string>& args) {
  TrainConfig c;
  const auto options = describe("mpiddp train options", train_options(), c);
  po::variables_map vm;
  int threads = 1;
  auto parse = [&] {
    vm = parse_options(options, args);
    if (!vm.count("help")) threads = apply_options(c, vm, runtime);
  };
  if (auto code = agree_on_local_phase(runtime, "train", parse)) return *code;
  if (vm.count("help")) {
    print_help(runtime,
               "usage: mpirun -np N mpiddp train --data TRAIN.h5 [--test-data TEST.h5] [options]\n\n"
               "Options are read from the command line, then --config FILE, then MPIDDP_<NAME> variables\n"
               "(--batch-size <- MPIDDP_BATCH_SIZE); the first that sets one wins.\n\n",
               options);
    return kExitOk;
  }
  if (c.t.activation_checkpointing) {
    // Memory before speed: freed buffers above 4 MiB go back to the kernel (allocator.hpp).
    const auto line = tune_malloc_for_training(kMallocLeanMmapThresholdBytes);
    if (runtime.rank() == 0) std::printf("%s (activation checkpointing)\n", line.c_str());
  }
  auto pg = make_process_group(c.backend, runtime);  // collective: after every rank accepted the options
  std::unique_ptr<Trainer> trainer;
  auto build = [&] { trainer = make_trainer(c, threads, runtime, *pg); };
  if (auto code = agree_on_local_phase(runtime, "train", build)) return *code;
  if (runtime.rank() == 0) print_start(*trainer, c, threads, runtime);
  if (c.dry_run) {
    const auto plan = trainer->plan_memory();
    if (runtime.rank() == 0) std::printf("%s\n", plan.describe().c_str());
    return kExitOk;
  }
  const auto result = trainer->fit(
      [&](const EpochMetrics& m, const std::vector<std::string>& lines) {
        if (runtime.rank() == 0) print_epoch(m, lines);
      },
      [](const std::string& note) {
        std::printf("%s\n", note.c_str());
        std::fflush(stdout);
      });
  if (runtime.rank() == 0 && result.stop_signal == 0 && !result.last_snapshot.empty()) {
    std::printf("final snapshot: %s (global step %lld)\n", result.last_snapshot.c_str(),
                static_cast<long long>(result.global_step));
  }
  return kExitOk;
}

}  // namespace mpiddp::app
