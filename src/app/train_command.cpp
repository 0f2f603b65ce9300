// `mpiddp train`: DDP training of a built-in model or a TorchScript file on an HDF5 dataset, a thin
// client of mpiddp::Trainer. Options come from the command line, then --config FILE, then
// MPIDDP_* variables (see cli.hpp).
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
#include <thread>

#include <nlohmann/json.hpp>

#include "app/cli.hpp"
#include <mpiddp/models.hpp>

namespace mpiddp::app {

namespace {

// What the command line says, before it becomes a model, an optimizer and TrainerOptions.
struct TrainConfig {
  std::string model = "cnn", loss = "auto", optimizer = "adam", schedule = "none", device = "cpu", backend = "mpi";
  std::string on_nan = "stop", compression = "none", log_every = "auto", precision = "fp32";
  std::string betas = "0.9,0.999", decay_params = "all", init_from;
  double lr = 0, momentum = 0, weight_decay = 0, gamma = 0.1, min_lr = 0;
  GptConfig gpt;
  double bucket_mb = 25, first_bucket_mb = 1, cache_mb = 512;
  int64_t step_size = 1, warmup_steps = 0;
  int threads = 0;
  TrainerOptions t;
};

// The flag that sets each TrainerOptions field: the library owns the rules (validate()), the CLI
// only names them.
std::string flag_of(const std::string& field) {
  static const std::map<std::string, std::string> kFlags = {
      {"data", "--data"}, {"epochs", "--epochs"}, {"batch_size", "--batch-size"}, {"max_steps", "--max-steps"},
      {"log_every_steps", "--log-every"}, {"log_every_seconds", "--log-every"}, {"log_min_gap_seconds", "--log-every"},
      {"clip_grad_norm", "--clip-grad-norm"}, {"precision", "--precision"}, {"loss_scaling.init_scale", "--loss-scale"},
      {"save_every", "--save-every"}, {"save_every_steps", "--save-every-steps"}, {"keep", "--keep"},
      {"cache_bytes", "--cache-mb"}, {"prefetch_batches", "--prefetch"}, {"resume", "--resume"},
      {"grad_accum", "--grad-accum"}, {"data_format", "--data-format"}, {"block_size", "--block-size"},
      {"zero_stage", "--zero-stage"}};
  const auto it = kFlags.find(field);
  return it == kFlags.end() ? "TrainerOptions::" + field : it->second;
}

// "B1,B2" as Adam's betas.
std::tuple<double, double> betas_of(const std::string& text) {
  std::smatch m;
  static const std::regex kPair(R"(\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*,\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*)");
  MPIDDP_CHECK(std::regex_match(text, m, kPair), "--betas takes two numbers B1,B2 (e.g. 0.9,0.95), got '" + text + "'");
  const double b1 = std::stod(m[1]), b2 = std::stod(m[2]);
  MPIDDP_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "--betas must each be in [0, 1), got '" + text + "'");
  return {b1, b2};
}

// The flags that are the CLI's own (not TrainerOptions fields): their rules live here.
void check_cli_flags(const Runtime& runtime, const TrainConfig& c) {
  MPIDDP_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be > 0, got " + std::to_string(c.lr));
  MPIDDP_CHECK(c.momentum >= 0 && c.weight_decay >= 0, "--momentum and --weight-decay must be >= 0");
  MPIDDP_CHECK(c.optimizer == "sgd" || c.optimizer == "adam" || c.optimizer == "adamw",
               "unknown --optimizer '" + c.optimizer + "' (sgd, adam, adamw)");
  MPIDDP_CHECK(c.schedule == "none" || c.schedule == "step" || c.schedule == "cosine",
               "unknown --lr-schedule '" + c.schedule + "' (none, step, cosine)");
  MPIDDP_CHECK(c.step_size > 0 && c.gamma > 0 && c.warmup_steps >= 0, "bad schedule parameters");
  MPIDDP_CHECK(c.min_lr >= 0 && c.min_lr <= c.lr, "--min-lr must be in [0, --lr], got " + std::to_string(c.min_lr));
  MPIDDP_CHECK(c.decay_params == "all" || c.decay_params == "matrices",
               "unknown --weight-decay-params '" + c.decay_params + "' (all, matrices)");
  MPIDDP_CHECK(c.optimizer != "sgd" || c.betas == "0.9,0.999", "--betas applies to adam and adamw, not sgd");
  betas_of(c.betas);  // throws on a malformed pair
  if (c.model == "gpt") c.gpt.validate();
  MPIDDP_CHECK(c.init_from.empty() || std::filesystem::is_regular_file(c.init_from),
               "--init-from: state_dict file '" + c.init_from + "' does not exist");
  MPIDDP_CHECK(c.loss == "auto" || c.loss == "cross-entropy" || c.loss == "mse" || c.loss == "model",
               "unknown --loss '" + c.loss + "' (auto, cross-entropy, mse, model)");
  MPIDDP_CHECK(c.device == "cpu" || c.device == "cuda", "unknown --device '" + c.device + "' (cpu, cuda)");
  MPIDDP_CHECK(c.threads >= 0, "--threads must be >= 0");
  const auto built = available_backends();
  MPIDDP_CHECK(std::find(built.begin(), built.end(), c.backend) != built.end(),
               "backend '" + c.backend + "' is not built into this mpiddp");
  if (c.device == "cuda") {
    MPIDDP_CHECK(torch::cuda::is_available() && runtime.device().is_cuda(),
                 "--device cuda: this libtorch has no CUDA or no GPU is visible");
  }
  // mpi takes either device (CUDA tensors: CUDA-aware MPI, else staged through the host).
  MPIDDP_CHECK(c.backend != "nccl" || c.device == "cuda", "--backend nccl goes with --device cuda");
  MPIDDP_CHECK(c.backend != "gloo" || c.device == "cpu", "--backend gloo goes with --device cpu");
  MPIDDP_CHECK(c.on_nan == "stop" || c.on_nan == "skip", "unknown --on-nan '" + c.on_nan + "' (stop, skip)");
  MPIDDP_CHECK(std::regex_match(c.log_every, std::regex(R"(auto|[0-9]+|[0-9]+(\.[0-9]+)?s)")),
               "--log-every takes auto, N (steps), Ns (seconds) or 0 (off), got '" + c.log_every + "'");
  MPIDDP_CHECK(c.bucket_mb > 0 && c.first_bucket_mb > 0, "--bucket-cap-mb and --first-bucket-cap-mb must be > 0");
  MPIDDP_CHECK(c.compression == "none" || c.compression == "bf16" || c.compression == "fp16",
               "unknown --compression '" + c.compression + "' (none, bf16, fp16)");
}

// The optimizer's parameter groups: one, or nanoGPT's two (--weight-decay-params matrices: tensors
// of two or more dimensions decay, biases, norms and other vectors do not).
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> param_groups(const TrainConfig& c, const Model& model, Options options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : parameters(model)) (c.decay_params == "all" || p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<Options>(Options(options).weight_decay(c.weight_decay)));
  if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<Options>(Options(options).weight_decay(0.0)));
  return groups;
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, const Model& model) {
  if (c.optimizer == "sgd") {
    return std::make_shared<torch::optim::SGD>(param_groups(c, model, torch::optim::SGDOptions(c.lr).momentum(c.momentum)),
                                               torch::optim::SGDOptions(c.lr));
  }
  if (c.optimizer == "adam") {
    const auto o = torch::optim::AdamOptions(c.lr).betas(betas_of(c.betas));
    return std::make_shared<FusedAdam>(param_groups(c, model, o), o);
  }
  const auto o = torch::optim::AdamWOptions(c.lr).betas(betas_of(c.betas));
  return std::make_shared<FusedAdamW>(param_groups(c, model, o), o);
}

std::string config_json(const TrainConfig& c, int threads, int world_size) {
  const auto& t = c.t;
  nlohmann::json j = {{"model", c.model}, {"data", t.data}, {"test_data", t.test_data}, {"epochs", t.epochs},
                      {"max_steps", t.max_steps}, {"batch_size", t.batch_size}, {"lr", c.lr},
                      {"optimizer", c.optimizer}, {"momentum", c.momentum}, {"weight_decay", c.weight_decay},
                      {"lr_schedule", c.schedule}, {"step_size", c.step_size}, {"gamma", c.gamma},
                      {"warmup_steps", c.warmup_steps}, {"seed", t.seed}, {"shuffle", t.shuffle},
                      {"drop_last", t.drop_last}, {"device", c.device}, {"backend", c.backend}, {"loss", c.loss},
                      {"threads", threads}, {"world_size", world_size}, {"on_nan", c.on_nan},
                      {"clip_grad_norm", t.clip_grad_norm}, {"log_every", c.log_every},
                      {"metrics", t.metrics_path}, {"tensorboard", t.tensorboard_dir},
                      {"precision", c.precision}, {"prefetch", t.prefetch_batches}, {"cache_mb", c.cache_mb},
                      {"data_format", t.data_format}, {"grad_accum", t.grad_accum}, {"zero_stage", t.zero_stage}, {"betas", c.betas},
                      {"weight_decay_params", c.decay_params}, {"min_lr", c.min_lr}, {"init_from", c.init_from}};
  // The GPT's shape: `mpiddp generate` rebuilds the model from it.
  if (c.model == "gpt") j["gpt"] = nlohmann::json::parse(c.gpt.to_json());
  if (c.precision == "fp16") j["loss_scale"] = t.loss_scaling.init_scale;
  return j.dump();
}

}  // namespace

int run_train(Runtime& runtime, const std::vector<std::string>& args) {
  TrainConfig c;
  auto& t = c.t;
  std::string timeline;
  po::options_description options("mpiddp train options");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>(), "read options from this file (name = value lines)")(
      "model", po::value(&c.model)->default_value("cnn"),
      "linear | mlp | cnn (PyTorch's MNIST example net) | gpt (nanoGPT's GPT; token data) | FILE.pt (a TorchScript "
      "module saved from Python)")(
      "loss", po::value(&c.loss)->default_value("auto"),
      "auto (cross-entropy for class labels and tokens, mse for regression) | cross-entropy | mse | model (a "
      "TorchScript forward(inputs, targets) returns (outputs, loss), as nanoGPT's GPT)")(
      "data", po::value(&t.data),
      "training set: an HDF5 file (see `mpiddp data`) or token shards (llm.c's .bin; names and globs, comma-separated)")(
      "test-data", po::value(&t.test_data), "test set, evaluated after each epoch and at the run's end")(
      "data-format", po::value(&t.data_format)->default_value("auto"),
      "auto (HDF5 for .h5/.hdf5, else llm.c token shards) | hdf5 | llmc | raw-uint16 (nanoGPT's headerless train.bin)")(
      "block-size", po::value(&c.gpt.block_size)->default_value(1024),
      "token data: tokens per sample (windows of T+1 at stride T); gpt: the context length")(
      "vocab-size", po::value(&c.gpt.vocab_size)->default_value(50304), "gpt: vocabulary (every token must be below it)")(
      "n-layer", po::value(&c.gpt.n_layer)->default_value(12), "gpt: transformer blocks")(
      "n-head", po::value(&c.gpt.n_head)->default_value(12), "gpt: attention heads")(
      "n-embd", po::value(&c.gpt.n_embd)->default_value(768), "gpt: width")(
      "dropout", po::value(&c.gpt.dropout)->default_value(0.0, "0"), "gpt: dropout")(
      "bias", po::value(&c.gpt.bias)->default_value(true, "true"), "gpt: biases in Linears and LayerNorms (true | false)")(
      "init-from", po::value(&c.init_from),
      "start from this state_dict (torch.save(model.state_dict()) or `mpiddp export`) instead of a fresh model")(
      "grad-accum", po::value(&t.grad_accum)->default_value(1),
      "micro-batches per optimizer step (each loss / K; gradients reduced only in the last)")(
      "zero-stage", po::value(&t.zero_stage)->default_value(0),
      "0 (DDP) | 1 (ZeRO: each rank keeps 1/N of the optimizer state) | 2 (and 1/N of the gradients)")(
      "epochs", po::value(&t.epochs)->default_value(1), "passes over the training set")(
      "max-steps", po::value(&t.max_steps)->default_value(0), "stop after this many steps in all (0: no cap)")(
      "batch-size", po::value(&t.batch_size)->default_value(64), "samples per rank per step")(
      "lr", po::value(&c.lr)->default_value(0, "auto"), "learning rate (auto: 0.001 for adam and adamw, 0.01 for sgd)")(
      "optimizer", po::value(&c.optimizer)->default_value("adam"),
      "adam (the default: good results without tuning) | adamw | sgd")(
      "momentum", po::value(&c.momentum)->default_value(0.0), "sgd momentum")(
      "weight-decay", po::value(&c.weight_decay)->default_value(0.0), "weight decay")(
      "weight-decay-params", po::value(&c.decay_params)->default_value("all"),
      "all | matrices (nanoGPT's groups: only tensors of 2+ dimensions decay)")(
      "betas", po::value(&c.betas)->default_value("0.9,0.999"), "adam/adamw: B1,B2")(
      "min-lr", po::value(&c.min_lr)->default_value(0.0, "0"), "cosine schedule: the rate it decays to")(
      "lr-schedule", po::value(&c.schedule)->default_value("none"), "none | step | cosine")(
      "step-size", po::value(&c.step_size)->default_value(1), "step schedule: epochs between decays")(
      "gamma", po::value(&c.gamma)->default_value(0.1), "step schedule: decay factor")(
      "warmup-steps", po::value(&c.warmup_steps)->default_value(0),
      "linear warmup over this many steps (cosine: nanoGPT's get_lr, (step+1)/(N+1) then decay to --min-lr)")(
      "seed", po::value(&t.seed)->default_value(0), "seed of the initial model and the sampler's shuffle")(
      "no-shuffle", "keep the dataset's order")("drop-last", "drop the tail instead of padding shards to equal length")(
      "device", po::value(&c.device)->default_value("cpu"), "cpu | cuda")(
      "backend", po::value(&c.backend)->default_value("mpi"), "mpi | nccl | gloo")(
      "threads", po::value(&c.threads)->default_value(0), "intra-op threads per rank (0: the cores each rank owns)")(
      "metrics", po::value(&t.metrics_path),
      "append JSON lines to this file (rank 0): one per epoch (\"kind\": \"epoch\") and one per progress line (\"kind\": \"log\")")(
      "tensorboard", po::value(&t.tensorboard_dir),
      "write TensorBoard event files to this directory (rank 0): train/* scalars per progress line, epoch/* per epoch, "
      "the options as text")(
      "cache-mb", po::value(&c.cache_mb)->default_value(512.0),
      "read a dataset into memory once when it is at most this size (MiB; 0: read every batch from the file)")(
      "prefetch", po::value(&t.prefetch_batches)->default_value(2),
      "batches a reader thread prepares ahead of the step (0: read on the training thread; uncached data "
      "with a parallel HDF5 is then read by one collective MPI-IO read per step)")(
      "bucket-cap-mb", po::value(&c.bucket_mb)->default_value(25.0), "DDP bucket cap (MiB)")(
      "first-bucket-cap-mb", po::value(&c.first_bucket_mb)->default_value(1.0), "DDP first bucket cap (MiB)")(
      "compression", po::value(&c.compression)->default_value("none"), "gradients on the wire: none | bf16 | fp16")(
      "timeline", po::value(&timeline), "per-rank Chrome trace of DDP (FILE -> FILE.rank<r>.json)")(
      "snapshot-dir", po::value(&t.snapshot_dir), "write snapshots here (rank 0; HDF5, latest.h5 names the newest)")(
      "save-every", po::value(&t.save_every)->default_value(1), "snapshot every N epochs (0: only at the end)")(
      "save-every-steps", po::value(&t.save_every_steps)->default_value(0), "also snapshot every N steps (0: off)")(
      "keep", po::value(&t.keep)->default_value(3), "snapshots kept in --snapshot-dir (0: all)")(
      "resume", po::value(&t.resume)->default_value("auto"),
      "auto (newest valid snapshot in --snapshot-dir, if any) | never | a snapshot file")(
      "on-nan", po::value(&c.on_nan)->default_value("stop"),
      "NaN/Inf loss: stop (an error naming the step) | skip (drop that step's update)")(
      "log-every", po::value(&c.log_every)->default_value("auto"),
      "progress lines within an epoch (rank 0): auto (every tenth of an epoch or 30 s, whichever first, "
      "at least 2 s apart) | N (every N steps) | Ns (every N seconds) | 0 (none)")(
      "precision", po::value(&c.precision)->default_value("fp32"),
      "fp32 | bf16 (autocast: CPU and CUDA) | fp16 (autocast + dynamic loss scaling: CUDA; CPU with libtorch 2.x)")(
      "loss-scale", po::value(&t.loss_scaling.init_scale)->default_value(65536.0, "65536"),
      "fp16: the initial loss scale (halved on a step with Inf/NaN gradients, doubled after 2000 good steps)")(
      "clip-grad-norm", po::value(&t.clip_grad_norm)->default_value(0.0, "0"),
      "scale the averaged gradients to a global L2 norm of at most X before each update (0: off)");

  po::variables_map vm;
  int threads = 1;
  auto parse = [&] {
    vm = parse_options(options, args);
    if (vm.count("help")) return;
    t.shuffle = vm.count("no-shuffle") == 0;
    t.drop_last = vm.count("drop-last") > 0;
    if (vm["lr"].defaulted()) c.lr = c.optimizer == "sgd" ? 0.01 : 0.001;
    check_cli_flags(runtime, c);
    t.ddp.bucket_cap_bytes = static_cast<int64_t>(c.bucket_mb * (1 << 20));
    t.ddp.first_bucket_cap_bytes = static_cast<int64_t>(c.first_bucket_mb * (1 << 20));
    if (c.compression == "bf16") t.ddp.compression = c10::kBFloat16;
    if (c.compression == "fp16") t.ddp.compression = c10::kHalf;
    t.ddp.timeline_path = timeline;
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
    LrSchedule schedule;
    if (c.schedule == "step") schedule = step_lr(c.step_size, c.gamma);
    if (c.schedule == "cosine") {
      t.lr_schedule = cosine_lr(c.warmup_steps, c.min_lr / c.lr);  // warmup included, as nanoGPT's
    } else {
      t.lr_schedule = c.warmup_steps > 0 ? with_warmup(schedule, c.warmup_steps) : schedule;
    }
    t.block_size = c.gpt.block_size;
    if (c.loss == "cross-entropy") t.loss = cross_entropy_loss();
    if (c.loss == "mse") t.loss = mse_loss();
    t.model_loss = c.loss == "model";
    // Never oversubscribe: the cores of this node shared among its ranks.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = c.threads > 0 ? c.threads : std::max(1, cores / runtime.local_size());
    t.run_config = config_json(c, threads, runtime.size());
    t.validate(flag_of, runtime.rank());
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
  auto pg = make_process_group(c.backend, runtime);  // collective: after every rank accepted the options
  std::unique_ptr<Trainer> trainer;
  auto build = [&] {
    torch::set_num_threads(threads);
    torch::manual_seed(t.seed);  // the same initial model on every rank (DDP broadcasts rank 0's anyway)
    auto model = make_model(c.model, open_sample_set(t.data, t)->info(), c.gpt);
    if (!c.init_from.empty()) {
      try {
        load_named(*model, read_state_dict(c.init_from));
      } catch (const Error& e) {
        MPIDDP_THROW("--init-from '" + c.init_from + "': " + e.message());
      }
    }
    trainer = std::make_unique<Trainer>(runtime, *pg, model, make_optimizer(c, *model), t);
  };
  if (auto code = agree_on_local_phase(runtime, "train", build)) return *code;
  if (runtime.rank() == 0) {
    int64_t params = 0;
    for (const auto& p : parameters(trainer->model())) params += p.numel();  // a tied weight once
    std::printf("mpiddp train: model %s (%lld parameters), %d rank(s) x batch %lld, %d thread(s) per rank, backend %s, device %s\n",
                trainer->model().description().c_str(), static_cast<long long>(params), runtime.size(),
                static_cast<long long>(t.batch_size), threads, c.backend.c_str(), c.device.c_str());
    std::fflush(stdout);
  }
  const auto result = trainer->fit([&](const EpochMetrics& m, const std::vector<std::string>& lines) {
    if (runtime.rank() != 0) return;
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::printf("epoch %lld: train loss %.4f", static_cast<long long>(m.epoch), m.train_loss);
    if (m.test_loss >= 0) std::printf(", test loss %.4f", m.test_loss);
    if (m.test_accuracy >= 0) std::printf(", test accuracy %.2f%%", 100.0 * m.test_accuracy);
    std::printf(", %.1f samples/s", m.samples_per_s);
    if (m.tokens_per_s > 0) std::printf(" (%.0f tokens/s)", m.tokens_per_s);
    std::printf(", %.1f s, lr %.3g", m.seconds, m.lr);
    if (m.skipped_steps > 0) std::printf(", %lld step(s) skipped (NaN/Inf loss)", static_cast<long long>(m.skipped_steps));
    if (m.loss_scale > 0) {
      std::printf(", loss scale %g (%lld step(s) skipped for Inf/NaN gradients)", m.loss_scale,
                  static_cast<long long>(m.overflow_steps));
    }
    std::printf("\n");
    std::fflush(stdout);
  }, [](const std::string& note) {
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
