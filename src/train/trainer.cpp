#include <mpiddp/checkpoint.hpp>
#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>

#include <ATen/core/Generator.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace mpiddp {

namespace {

int64_t flat_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

torch::nn::Sequential make_model(const std::string& name, const DatasetInfo& data) {
  namespace nn = torch::nn;
  const int64_t in = flat_size(data.sample_shape);
  const int64_t out = data.classification ? data.num_classes : data.target_dim;
  if (name == "linear") return nn::Sequential(nn::Flatten(), nn::Linear(in, out));
  if (name == "mlp") {
    return nn::Sequential(nn::Flatten(), nn::Linear(in, 128), nn::ReLU(), nn::Linear(128, 64), nn::ReLU(),
                          nn::Linear(64, out));
  }
  if (name == "cnn") {
    MPIDDP_CHECK(data.sample_shape == std::vector<int64_t>({1, 28, 28}),
                 "--model cnn needs inputs of [1, 28, 28]; '" + data.path + "' has " + shape_text(data.sample_shape));
    MPIDDP_CHECK(data.classification && data.num_classes == 10,
                 "--model cnn needs 10 classes; '" + data.path + "' has " +
                     (data.classification ? std::to_string(data.num_classes) + " classes" : "regression targets"));
    // PyTorch's examples/mnist network.
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3)), nn::ReLU(), nn::Conv2d(nn::Conv2dOptions(32, 64, 3)),
                          nn::ReLU(), nn::MaxPool2d(2), nn::Dropout(0.25), nn::Flatten(), nn::Linear(9216, 128),
                          nn::ReLU(), nn::Dropout(0.5), nn::Linear(128, 10));
  }
  MPIDDP_THROW("unknown --model '" + name + "' (linear, mlp, cnn)");
}

Trainer::Trainer(const Runtime& runtime, TrainConfig config) : runtime_(runtime), config_(std::move(config)) {
  auto& c = config_;
  MPIDDP_CHECK(c.epochs > 0, "--epochs must be > 0, got " + std::to_string(c.epochs));
  MPIDDP_CHECK(c.batch_size > 0, "--batch-size must be > 0, got " + std::to_string(c.batch_size));
  MPIDDP_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be > 0, got " + std::to_string(c.lr));
  MPIDDP_CHECK(c.max_steps >= 0, "--max-steps must be >= 0");
  MPIDDP_CHECK(c.momentum >= 0 && c.weight_decay >= 0, "--momentum and --weight-decay must be >= 0");
  MPIDDP_CHECK(c.optimizer == "sgd" || c.optimizer == "adam" || c.optimizer == "adamw",
               "unknown --optimizer '" + c.optimizer + "' (sgd, adam, adamw)");
  MPIDDP_CHECK(c.schedule == "none" || c.schedule == "step" || c.schedule == "cosine",
               "unknown --lr-schedule '" + c.schedule + "' (none, step, cosine)");
  MPIDDP_CHECK(c.step_size > 0 && c.gamma > 0 && c.warmup_steps >= 0, "bad schedule parameters");
  MPIDDP_CHECK(c.device == "cpu" || c.device == "cuda", "unknown --device '" + c.device + "' (cpu, cuda)");
  MPIDDP_CHECK(c.threads >= 0, "--threads must be >= 0");
  const auto built = available_backends();
  MPIDDP_CHECK(std::find(built.begin(), built.end(), c.backend) != built.end(),
               "backend '" + c.backend + "' is not built into this mpiddp");
  if (c.device == "cuda") {
    MPIDDP_CHECK(torch::cuda::is_available() && runtime.device().is_cuda(),
                 "--device cuda: this libtorch has no CUDA or no GPU is visible");
    device_ = runtime.device();
  }
  MPIDDP_CHECK((c.backend == "nccl") == (c.device == "cuda"),
               "--backend nccl goes with --device cuda, mpi and gloo with --device cpu");
  MPIDDP_CHECK(!c.data.empty(), "--data is required");
  MPIDDP_CHECK(c.save_every >= 0 && c.save_every_steps >= 0, "--save-every and --save-every-steps must be >= 0");
  MPIDDP_CHECK(c.keep >= 0, "--keep must be >= 0");
  MPIDDP_CHECK(c.on_nan == "stop" || c.on_nan == "skip", "unknown --on-nan '" + c.on_nan + "' (stop, skip)");
  MPIDDP_CHECK(!c.resume.empty(), "--resume takes auto, never or a snapshot file");
  if (c.resume != "auto" && c.resume != "never" && runtime.rank() == 0) {
    MPIDDP_CHECK(std::filesystem::exists(c.resume), "--resume: snapshot '" + c.resume + "' does not exist");
  }
  // Only rank 0 writes snapshots: it alone needs the directory.
  if (!c.snapshot_dir.empty() && runtime.rank() == 0) SnapshotDir(c.snapshot_dir).ensure_writable();

  MPIDDP_CHECK(c.cache_bytes >= 0, "--cache-mb must be >= 0");
  train_ = std::make_unique<H5Dataset>(c.data);
  train_->cache(c.cache_bytes);
  const auto& info = train_->info();
  model_ = make_model(c.model, info);
  if (info.classification) {
    train_->check_labels(c.model == "cnn" ? 10 : info.num_classes);
  }
  if (!c.test_data.empty()) {
    test_ = std::make_unique<H5Dataset>(c.test_data);
    test_->cache(c.cache_bytes);
    const auto& t = test_->info();
    MPIDDP_CHECK(t.sample_shape == info.sample_shape && t.classification == info.classification &&
                     t.target_dim == info.target_dim,
                 "--test-data '" + c.test_data + "' does not match --data: inputs " + shape_text(t.sample_shape) +
                     " vs " + shape_text(info.sample_shape));
    if (t.classification) test_->check_labels(c.model == "cnn" ? 10 : info.num_classes);
  }
  DistributedSampler sampler(info.samples, runtime.rank(), runtime.size(), c.shuffle, c.seed, c.drop_last);
  steps_per_epoch_ = sampler.num_samples() / c.batch_size;
  MPIDDP_CHECK(steps_per_epoch_ > 0, "fewer samples than ranks x batch: " + std::to_string(info.samples) +
                                         " samples cannot fill one batch of " + std::to_string(c.batch_size) +
                                         " on each of " + std::to_string(runtime.size()) + " ranks");
  // Never oversubscribe: the cores of this node shared among its ranks.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_ = c.threads > 0 ? c.threads : std::max(1, cores / runtime.local_size());
}

Trainer::~Trainer() = default;

double Trainer::lr_at(int64_t global_step, int64_t epoch, int64_t total_steps) const {
  const auto& c = config_;
  double lr = c.lr;
  if (c.schedule == "step") lr *= std::pow(c.gamma, static_cast<double>(epoch / c.step_size));
  if (c.schedule == "cosine" && total_steps > 0) {
    lr *= 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(global_step) / static_cast<double>(total_steps)));
  }
  if (c.warmup_steps > 0 && global_step < c.warmup_steps) {
    lr *= static_cast<double>(global_step + 1) / static_cast<double>(c.warmup_steps);
  }
  return lr;
}

std::pair<double, double> Trainer::evaluate(ProcessGroup& pg) {
  // Each rank scores a contiguous slice of the test set (no padding: every sample counts once);
  // the sums are all-reduced.
  torch::NoGradGuard no_grad;
  model_->eval();
  const int64_t n = test_->size(), r = runtime_.rank(), w = runtime_.size();
  const int64_t begin = n * r / w, end = n * (r + 1) / w;
  double loss_sum = 0, correct = 0;
  constexpr int64_t kEvalBatch = 1000;
  for (int64_t b = begin; b < end; b += kEvalBatch) {
    auto e = test_->read_range(b, std::min(kEvalBatch, end - b));
    auto out = model_->forward(e.inputs.to(device_));
    auto y = e.targets.to(device_);
    if (train_->info().classification) {
      loss_sum += torch::nn::functional::cross_entropy(
                      out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      correct += out.argmax(1).eq(y).sum().item<double>();
    } else {
      loss_sum += torch::mse_loss(out, y, torch::Reduction::Sum).item<double>() / static_cast<double>(y.size(1));
    }
  }
  auto sums = torch::tensor({loss_sum, correct}, torch::kDouble).to(device_);
  pg.allreduce(sums);
  sums = sums.cpu();
  model_->train();
  const double total = static_cast<double>(n);
  return {sums[0].item<double>() / total,
          train_->info().classification ? sums[1].item<double>() / total : -1.0};
}

// ---- snapshots ---------------------------------------------------------------------------------

struct Trainer::Progress {
  int64_t epoch = 0;          ///< the epoch in progress (0-based)
  int64_t step_in_epoch = 0;  ///< its steps already taken
  int64_t global_step = 0;
  double loss_sum = 0;        ///< sum of its steps' losses so far
  double seconds = 0;         ///< its training time so far
  int64_t skipped = 0;        ///< steps skipped for a NaN/Inf loss, in all
  double lr = 0;
};

namespace {

// Set by the handler; read at step boundaries, where every rank learns every rank's value.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int signo) { g_stop_signal = signo; }

// SIGTERM (Slurm's preemption, scancel) and SIGUSR1 (`sbatch --signal=USR1@T`) ask training to
// stop at the next step boundary; installed for the duration of fit(). The old handlers come back
// only if no such signal came: after one did, the process is on its way out, and a second copy
// (Slurm signals every task, launchers forward theirs) must not kill a rank that already stopped
// cleanly.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = record_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGUSR1, &sa, &old_usr1_);
  }
  ~StopSignals() {
    if (g_stop_signal != 0) return;
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGUSR1, &old_usr1_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_usr1_ {};
};

std::string tensor_text(const torch::Tensor& t) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  return std::string(c10::toString(t.scalar_type())) + shape_text(shape);
}

// The optimizers' per-parameter state as named tensors, and back. Adam and AdamW keep the same
// fields under different types.
template <class State>
void adam_state_out(const State& st, const std::string& prefix, Snapshot& s) {
  s.tensors[prefix + "step"] = torch::tensor(static_cast<int64_t>(st.step()), torch::kLong);
  s.tensors[prefix + "exp_avg"] = st.exp_avg().cpu();
  s.tensors[prefix + "exp_avg_sq"] = st.exp_avg_sq().cpu();
  if (st.max_exp_avg_sq().defined()) s.tensors[prefix + "max_exp_avg_sq"] = st.max_exp_avg_sq().cpu();
}

template <class State>
std::unique_ptr<State> adam_state_in(const Snapshot& s, const std::string& prefix, c10::Device device) {
  auto st = std::make_unique<State>();
  st->step(s.tensors.at(prefix + "step").template item<int64_t>());
  st->exp_avg(s.tensors.at(prefix + "exp_avg").to(device));
  st->exp_avg_sq(s.tensors.at(prefix + "exp_avg_sq").to(device));
  auto m = s.tensors.find(prefix + "max_exp_avg_sq");
  if (m != s.tensors.end()) st->max_exp_avg_sq(m->second.to(device));
  return st;
}

const torch::optim::OptimizerParamState* state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  const auto& state = opt.state();
  auto it = state.find(compat::optimizer_state_key(state, p.unsafeGetTensorImpl()));
  return it == state.end() ? nullptr : it->second.get();
}

// The generators this rank draws from: the CPU one, and the GPU's when training there.
std::vector<at::Generator> generators(c10::Device device) {
  std::vector<at::Generator> g{at::globalContext().defaultGenerator(c10::Device(c10::kCPU))};
  if (device.is_cuda()) g.push_back(at::globalContext().defaultGenerator(device));
  return g;
}

std::string rng_state_bytes(c10::Device device) {
  std::string bytes;
  for (auto& g : generators(device)) {
    std::lock_guard<std::mutex> lock(g.mutex());
    auto t = g.get_state().contiguous();
    const auto n = static_cast<uint64_t>(t.numel());
    bytes.append(reinterpret_cast<const char*>(&n), sizeof n);
    bytes.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(n));
  }
  return bytes;
}

void set_rng_state(c10::Device device, const torch::Tensor& packed) {
  const auto* p = packed.data_ptr<uint8_t>();
  const auto* end = p + packed.numel();
  for (auto& g : generators(device)) {
    uint64_t n = 0;
    MPIDDP_CHECK(end - p >= static_cast<ptrdiff_t>(sizeof n), "snapshot: RNG state too short for this device");
    std::memcpy(&n, p, sizeof n);
    p += sizeof n;
    MPIDDP_CHECK(end - p >= static_cast<ptrdiff_t>(n), "snapshot: RNG state too short for this device");
    auto t = torch::empty({static_cast<int64_t>(n)}, torch::kByte);
    std::memcpy(t.data_ptr(), p, n);
    p += n;
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(t);
  }
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace

std::string Trainer::fingerprint() const {
  std::string text = "model " + config_.model + "\n";
  for (const auto& p : model_->named_parameters()) text += "parameter " + p.key() + " " + tensor_text(p.value()) + "\n";
  for (const auto& b : model_->named_buffers()) text += "buffer " + b.key() + " " + tensor_text(b.value()) + "\n";
  return text;
}

std::string Trainer::config_json() const {
  const auto& c = config_;
  nlohmann::json j = {{"model", c.model}, {"data", c.data}, {"test_data", c.test_data}, {"epochs", c.epochs},
                      {"max_steps", c.max_steps}, {"batch_size", c.batch_size}, {"lr", c.lr},
                      {"optimizer", c.optimizer}, {"momentum", c.momentum}, {"weight_decay", c.weight_decay},
                      {"lr_schedule", c.schedule}, {"step_size", c.step_size}, {"gamma", c.gamma},
                      {"warmup_steps", c.warmup_steps}, {"seed", c.seed}, {"shuffle", c.shuffle},
                      {"drop_last", c.drop_last}, {"device", c.device}, {"backend", c.backend},
                      {"threads", threads_}, {"world_size", runtime_.size()}, {"on_nan", c.on_nan}};
  return j.dump();
}

std::string Trainer::save(const torch::optim::Optimizer& opt, const Progress& p) {
  // Every rank's RNG state goes to rank 0, which alone writes; its verdict is broadcast so that
  // every rank fails alike when the write fails.
  const auto rng = gather_strings(runtime_.world(), rng_state_bytes(device_));
  std::string status, path;
  if (runtime_.rank() == 0) {
    try {
      const auto& c = config_;
      Snapshot s;
      for (const auto& t : model_->named_parameters()) s.tensors["model/" + t.key()] = t.value().detach().cpu();
      for (const auto& t : model_->named_buffers()) s.tensors["model/" + t.key()] = t.value().detach().cpu();
      for (const auto& t : model_->named_parameters()) {
        const auto* st = state_of(opt, t.value());
        if (!st) continue;
        const std::string prefix = "optimizer/" + t.key() + "/";
        if (c.optimizer == "sgd") {
          const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*st);
          if (sgd.momentum_buffer().defined()) s.tensors[prefix + "momentum_buffer"] = sgd.momentum_buffer().cpu();
        } else if (c.optimizer == "adam") {
          adam_state_out(static_cast<const torch::optim::AdamParamState&>(*st), prefix, s);
        } else {
          adam_state_out(static_cast<const torch::optim::AdamWParamState&>(*st), prefix, s);
        }
      }
      for (size_t r = 0; r < rng.size(); ++r) {
        auto t = torch::empty({static_cast<int64_t>(rng[r].size())}, torch::kByte);
        std::memcpy(t.data_ptr(), rng[r].data(), rng[r].size());
        s.tensors["rng/rank" + std::to_string(r)] = t;
      }
      s.ints = {{"epoch", p.epoch},
                {"step_in_epoch", p.step_in_epoch},
                {"global_step", p.global_step},
                {"skipped_steps", p.skipped},
                {"steps_per_epoch", steps_per_epoch_},
                {"world_size", runtime_.size()},
                {"threads", threads_},
                {"batch_size", c.batch_size},
                {"sampler_seed", static_cast<int64_t>(c.seed)},
                {"sampler_epoch", p.epoch},
                {"sampler_position", p.step_in_epoch * c.batch_size},
                {"sampler_shuffle", c.shuffle ? 1 : 0},
                {"sampler_drop_last", c.drop_last ? 1 : 0}};
      s.reals = {{"epoch_loss_sum", p.loss_sum}, {"epoch_seconds", p.seconds}, {"lr", p.lr},
                 {"created_unix_s", unix_seconds()}};
      s.texts = {{"model", c.model},
                 {"optimizer", c.optimizer},
                 {"lr_schedule", c.schedule},
                 {"model_fingerprint", fingerprint()},
                 {"config", config_json()},
                 {"mpiddp_version", MPIDDP_VERSION},
                 {"torch_version", compat::torch_version()}};
      path = SnapshotDir(c.snapshot_dir).save(s, p.global_step, c.keep);
    } catch (const std::exception& e) {
      status = e.what();
      if (const auto* err = dynamic_cast<const Error*>(&e)) status = err->message();
    }
  }
  broadcast_string(runtime_.world(), status);
  if (!status.empty()) MPIDDP_THROW_AGREED(status + " (the previous snapshot is intact)");
  return path;
}

namespace {

// Why a snapshot cannot continue this run ("" : it can): another model (the first differing
// line of the fingerprints) or another optimizer.
std::string incompatibility(const Snapshot& s, const std::string& fingerprint, const std::string& optimizer) {
  auto text = [&](const char* key) {
    auto it = s.texts.find(key);
    return it == s.texts.end() ? std::string() : it->second;
  };
  const std::string theirs = text("model_fingerprint");
  if (theirs != fingerprint) {
    std::istringstream a(theirs), b(fingerprint);
    std::string la, lb;
    while (true) {
      const bool more_a = static_cast<bool>(std::getline(a, la)), more_b = static_cast<bool>(std::getline(b, lb));
      if (!more_a && !more_b) break;
      if (!more_a) return "it is of another model: it lacks this model's " + lb;
      if (!more_b) return "it is of another model: it has " + la + ", which this model lacks";
      if (la != lb) return "it is of another model: it has " + la + " where this model has " + lb;
    }
  }
  if (text("optimizer") != optimizer) {
    return "it was trained with --optimizer " + text("optimizer") + ", this run uses " + optimizer;
  }
  return "";
}

}  // namespace

std::optional<Trainer::Progress> Trainer::restore(torch::optim::Optimizer& opt,
                                                  const std::function<void(const std::string&)>& note,
                                                  std::string* from) {
  const auto& c = config_;
  // Rank 0 picks the snapshot and checks it; the verdict, then the file's bytes, are broadcast,
  // so every rank loads the same state (the snapshot directory need not be shared).
  std::string status, name;
  std::vector<char> image;
  if (runtime_.rank() == 0 && c.resume != "never") {
    const bool automatic = c.resume == "auto";
    std::vector<std::string> candidates;
    if (!automatic) candidates.push_back(c.resume);
    else if (!c.snapshot_dir.empty()) candidates = SnapshotDir(c.snapshot_dir).list();
    const std::string mine = fingerprint();
    for (const auto& path : candidates) {
      try {
        auto bytes = read_file_bytes(path);
        const auto why = incompatibility(read_snapshot_image(bytes, path), mine, c.optimizer);
        if (!why.empty()) {
          status = "cannot resume from snapshot '" + path + "': " + why;
          break;
        }
        image = std::move(bytes);
        name = path;
        break;
      } catch (const Error& e) {
        if (!automatic) {
          status = "cannot resume: " + e.message();
          break;
        }
        if (note) note("warning: " + e.message() + "; falling back to the previous snapshot");
      }
    }
    if (status.empty() && image.empty() && !candidates.empty()) {
      status = "cannot resume: no valid snapshot in '" + c.snapshot_dir + "' (all " +
               std::to_string(candidates.size()) + " refused; see above)";
    }
  }
  broadcast_string(runtime_.world(), status);
  if (!status.empty()) MPIDDP_THROW_AGREED(status);
  broadcast_bytes(runtime_.world(), image);
  if (image.empty()) return std::nullopt;
  broadcast_string(runtime_.world(), name);
  Snapshot s;
  try {
    s = read_snapshot_image(image, name);
  } catch (const Error& e) {
    MPIDDP_THROW_AGREED(e.message());  // the same bytes on every rank: the same verdict
  }

  {
    torch::NoGradGuard no_grad;
    for (auto& t : model_->named_parameters()) t.value().copy_(s.tensors.at("model/" + t.key()));
    for (auto& t : model_->named_buffers()) t.value().copy_(s.tensors.at("model/" + t.key()));
  }
  auto& state = opt.state();
  for (const auto& t : model_->named_parameters()) {
    const std::string prefix = "optimizer/" + t.key() + "/";
    const auto key = compat::optimizer_state_key(state, t.value().unsafeGetTensorImpl());
    if (c.optimizer == "sgd") {
      auto m = s.tensors.find(prefix + "momentum_buffer");
      if (m == s.tensors.end()) continue;
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(m->second.to(device_));
      state[key] = std::move(st);
    } else if (s.tensors.count(prefix + "step")) {
      if (c.optimizer == "adam") state[key] = adam_state_in<torch::optim::AdamParamState>(s, prefix, device_);
      else state[key] = adam_state_in<torch::optim::AdamWParamState>(s, prefix, device_);
    }
  }
  // Each rank continues its own random stream; ranks the snapshot did not have take rank 0's.
  const int saved_world = static_cast<int>(s.ints.at("world_size"));
  const int source = runtime_.rank() < saved_world ? runtime_.rank() : 0;
  set_rng_state(device_, s.tensors.at("rng/rank" + std::to_string(source)));

  Progress p;
  p.epoch = s.ints.at("epoch");
  p.step_in_epoch = s.ints.at("step_in_epoch");
  p.global_step = s.ints.at("global_step");
  p.skipped = s.ints.at("skipped_steps");
  p.loss_sum = s.reals.at("epoch_loss_sum");
  p.seconds = s.reals.at("epoch_seconds");
  const int64_t saved_batch = s.ints.at("batch_size");
  if (saved_world != runtime_.size() || saved_batch != c.batch_size) {
    // Same global data order only when the global batch is kept; the position in the epoch is
    // carried over as samples consumed.
    const int64_t consumed = p.step_in_epoch * saved_batch * saved_world;
    const int64_t global_batch = c.batch_size * runtime_.size();
    p.step_in_epoch = consumed / global_batch;
    if (note) {
      note("note: the snapshot was taken at " + std::to_string(saved_world) + " rank(s) x batch " +
           std::to_string(saved_batch) + "; continuing at " + std::to_string(runtime_.size()) + " x " +
           std::to_string(c.batch_size) + (saved_world * saved_batch == global_batch
                                                ? " (same global batch: same global data order)"
                                                : " (another global batch: another data order)"));
    }
  }
  if (note) {
    note("Resuming training from snapshot at Epoch " + std::to_string(p.epoch) +
         (p.step_in_epoch > 0 ? ", step " + std::to_string(p.step_in_epoch) : std::string()) + " (global step " +
         std::to_string(p.global_step) + ", " + name + ")");
  }
  if (from) *from = name;
  return p;
}

// ---- training ------------------------------------------------------------------------------------

FitResult Trainer::fit(const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch,
                       const std::function<void(const std::string&)>& on_note) {
  const auto& c = config_;
  auto note = [&](const std::string& text) {
    if (on_note && runtime_.rank() == 0) on_note(text);
  };
  StopSignals stop_signals;
  torch::set_num_threads(threads_);
  torch::manual_seed(c.seed);  // the same initial model on every rank (DDP broadcasts rank 0's anyway)
  model_ = make_model(c.model, train_->info());
  model_->to(device_);
  auto pg = make_process_group(c.backend, runtime_);
  // A training set too large to cache is read batch by batch; with a parallel HDF5 each step's
  // reads become one collective MPI-IO read (every rank takes the same number of steps).
  if (train_->open_parallel(runtime_.world())) {
    note("data: '" + c.data + "' is larger than --cache-mb: read per batch, one collective MPI-IO read per step");
  } else if (!train_->cached()) {
    note("data: '" + c.data + "' is larger than --cache-mb: read per batch");
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (c.optimizer == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(model_->parameters(),
                                              torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  } else if (c.optimizer == "adam") {
    opt = std::make_unique<torch::optim::Adam>(model_->parameters(), torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(model_->parameters(),
                                                torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  FitResult result;
  Progress p = restore(*opt, note, &result.resumed_from).value_or(Progress{});
  DistributedDataParallel ddp(model_.ptr(), *pg, c.ddp);

  std::ofstream metrics;
  if (runtime_.rank() == 0 && !c.metrics_path.empty()) {
    metrics.open(c.metrics_path, std::ios::app);
    MPIDDP_CHECK(metrics.good(), "cannot write --metrics file '" + c.metrics_path + "'");
  }
  const bool classes = train_->info().classification;
  const bool snapshots = !c.snapshot_dir.empty();
  DistributedSampler sampler(train_->size(), runtime_.rank(), runtime_.size(), c.shuffle, c.seed, c.drop_last);
  const int64_t total_steps =
      c.max_steps > 0 ? std::min(c.max_steps, c.epochs * steps_per_epoch_) : c.epochs * steps_per_epoch_;
  // Per step, every rank learns the largest pending stop signal and the highest rank (+1) whose
  // loss was not finite: all ranks then take the same branch at the same step. This all-reduce is
  // issued before backward's buckets (the same order on every rank) and completes behind them.
  auto flags = torch::zeros({2}, torch::kLong);
  auto* flag = flags.data_ptr<int64_t>();
  auto flags_dev = device_.is_cpu() ? flags : flags.to(device_);
  double first_step_unix_s = 0;
  // A cached training set is gathered a block of steps at a time (one gather of up to 8 MiB of
  // float inputs) and each step takes a slice of the block: the same rows, one gather instead of
  // one per step. Otherwise every step reads its own rows (collectively when parallel).
  const int64_t sample_floats = std::max<int64_t>(1, flat_size(train_->info().sample_shape));
  const int64_t block_steps = std::max<int64_t>(1, (int64_t{8} << 20) / (4 * sample_floats * c.batch_size));
  Example block;
  int64_t block_first = -1, block_epoch = -1;
  auto batch_at = [&](const std::vector<int64_t>& indices, int64_t s) -> Example {
    const auto at = [&](int64_t step) { return indices.begin() + step * c.batch_size; };
    if (!train_->cached()) return train_->read_collective(std::vector<int64_t>(at(s), at(s + 1)));
    if (block_epoch != p.epoch || s >= block_first + block_steps) {  // steps only rise within an epoch
      const int64_t last = std::min(steps_per_epoch_, s + block_steps);
      block = train_->read(std::vector<int64_t>(at(s), at(last)));
      block_first = s;
      block_epoch = p.epoch;
    }
    const int64_t row = (s - block_first) * c.batch_size;
    return {block.inputs.narrow(0, row, c.batch_size), block.targets.narrow(0, row, c.batch_size)};
  };
  model_->train();
  for (; p.epoch < c.epochs && p.global_step < total_steps; ++p.epoch, p.step_in_epoch = 0, p.loss_sum = 0,
                                                                p.seconds = 0) {
    sampler.set_epoch(p.epoch);
    const auto indices = sampler.indices();
    const int64_t first = p.step_in_epoch, skipped_before = p.skipped;
    auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    p.lr = lr_at(p.global_step, p.epoch, total_steps);
    while (p.step_in_epoch < steps_per_epoch_ && p.global_step < total_steps) {
      const int64_t s = p.step_in_epoch;
      const Example e = batch_at(indices, s);
      p.lr = lr_at(p.global_step, p.epoch, total_steps);
      for (auto& group : opt->param_groups()) group.options().set_lr(p.lr);
      auto out = model_->forward(e.inputs.to(device_));
      auto y = e.targets.to(device_);
      auto loss = classes ? torch::nn::functional::cross_entropy(out, y) : torch::mse_loss(out, y);
      const double loss_value = loss.item<double>();
      flag[0] = static_cast<int64_t>(g_stop_signal);
      flag[1] = std::isfinite(loss_value) ? 0 : runtime_.rank() + 1;
      if (!device_.is_cpu()) flags_dev.copy_(flags);
      auto agreed = pg->allreduce_async(flags_dev, flags_dev, ReduceOp::kMax);
      ddp.backward(loss);
      agreed->wait();
      if (!device_.is_cpu()) flags.copy_(flags_dev);
      const int64_t stop = flag[0], bad_rank = flag[1] - 1;
      if (bad_rank >= 0) {
        const std::string where = "global step " + std::to_string(p.global_step) + " (epoch " +
                                  std::to_string(p.epoch) + ", step " + std::to_string(s) + ")";
        if (c.on_nan != "skip") {
          MPIDDP_THROW_AGREED("loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) +
                              "; stopping (--on-nan skip skips such steps instead)");
        }
        note("warning: loss is NaN or Inf at " + where + " on rank " + std::to_string(bad_rank) +
             "; update skipped");
        ++p.skipped;
      } else {
        opt->step();
        p.loss_sum += loss_value;
      }
      ddp.zero_grad();
      ++p.step_in_epoch;
      ++p.global_step;
      if (first_step_unix_s == 0) first_step_unix_s = unix_seconds();
      const bool due = c.save_every_steps > 0 && p.global_step % c.save_every_steps == 0;
      if (snapshots && (stop || due)) {
        p.seconds += elapsed();
        result.last_snapshot = save(*opt, p);
        t0 = std::chrono::steady_clock::now();
      }
      if (stop) {
        g_stop_signal = static_cast<std::sig_atomic_t>(stop);  // this rank too is on its way out (see StopSignals)
        result.stop_signal = static_cast<int>(stop);
        result.global_step = p.global_step;
        note("stopped by " + std::string(signal_name(result.stop_signal)) + " at global step " +
             std::to_string(p.global_step) + " (epoch " + std::to_string(p.epoch) + ", step " +
             std::to_string(p.step_in_epoch) + ")" +
             (snapshots ? "; snapshot " + result.last_snapshot + " written: rerun with --resume auto to continue"
                        : "; no --snapshot-dir, so nothing was saved"));
        return result;
      }
    }
    p.seconds += elapsed();
    const int64_t steps = p.step_in_epoch - first, taken = p.step_in_epoch - (p.skipped - skipped_before);
    EpochMetrics m;
    m.epoch = p.epoch + 1;
    m.steps = p.step_in_epoch;
    m.global_step = p.global_step;
    m.lr = p.lr;
    m.skipped_steps = p.skipped - skipped_before;
    if (result.epochs.empty()) m.first_step_unix_s = first_step_unix_s;  // this run's first epoch
    m.seconds = p.seconds;
    auto mean_loss =
        torch::tensor({taken > 0 ? p.loss_sum / static_cast<double>(taken) : 0.0}, torch::kDouble).to(device_);
    pg->allreduce(mean_loss, ReduceOp::kAvg);
    m.train_loss = mean_loss.cpu().item<double>();
    m.samples_per_s = p.seconds > 0 ? static_cast<double>(steps * c.batch_size * runtime_.size()) / p.seconds : 0;
    if (test_) std::tie(m.test_loss, m.test_accuracy) = evaluate(*pg);
    const std::string line = "[RANK " + std::to_string(runtime_.rank()) + "] Epoch " + std::to_string(p.epoch) +
                             " | Batchsize: " + std::to_string(c.batch_size) + " | Steps: " +
                             std::to_string(p.step_in_epoch);
    const auto lines = gather_strings(runtime_.world(), line);
    if (metrics.is_open()) {
      nlohmann::json j = {{"epoch", m.epoch}, {"steps", m.steps}, {"global_step", m.global_step},
                          {"train_loss", m.train_loss}, {"samples_per_s", m.samples_per_s}, {"seconds", m.seconds},
                          {"lr", m.lr}, {"world_size", runtime_.size()}, {"skipped_steps", m.skipped_steps}};
      if (m.first_step_unix_s > 0) j["first_step_unix_s"] = m.first_step_unix_s;
      if (test_) j["test_loss"] = m.test_loss;
      if (test_ && classes) j["test_accuracy"] = m.test_accuracy;
      metrics << j.dump() << std::endl;
    }
    result.epochs.push_back(m);
    if (on_epoch) on_epoch(m, lines);
    const bool due = c.save_every > 0 && (p.epoch + 1) % c.save_every == 0;
    const bool last = p.epoch + 1 == c.epochs || p.global_step >= total_steps;
    if (snapshots && (due || last)) {  // may replace a step snapshot of the same step: this form starts the next epoch
      Progress next = p;  // the epoch is complete: the snapshot starts the next one
      ++next.epoch;
      next.step_in_epoch = 0;
      next.loss_sum = next.seconds = 0;
      result.last_snapshot = save(*opt, next);
    }
  }
  result.global_step = p.global_step;
  return result;
}

}  // namespace mpiddp
