#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
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

  train_ = std::make_unique<H5Dataset>(c.data);
  const auto& info = train_->info();
  model_ = make_model(c.model, info);
  if (info.classification) {
    train_->check_labels(c.model == "cnn" ? 10 : info.num_classes);
  }
  if (!c.test_data.empty()) {
    test_ = std::make_unique<H5Dataset>(c.test_data);
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

std::vector<EpochMetrics> Trainer::fit(
    const std::function<void(const EpochMetrics&, const std::vector<std::string>&)>& on_epoch) {
  const auto& c = config_;
  torch::set_num_threads(threads_);
  torch::manual_seed(c.seed);  // the same initial model on every rank (DDP broadcasts rank 0's anyway)
  model_ = make_model(c.model, train_->info());
  model_->to(device_);
  auto pg = make_process_group(c.backend, runtime_);
  DistributedDataParallel ddp(model_.ptr(), *pg, c.ddp);
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
  std::ofstream metrics;
  if (runtime_.rank() == 0 && !c.metrics_path.empty()) {
    metrics.open(c.metrics_path, std::ios::app);
    MPIDDP_CHECK(metrics.good(), "cannot write --metrics file '" + c.metrics_path + "'");
  }
  const bool classes = train_->info().classification;
  DistributedSampler sampler(train_->size(), runtime_.rank(), runtime_.size(), c.shuffle, c.seed, c.drop_last);
  const int64_t total_steps =
      c.max_steps > 0 ? std::min(c.max_steps, c.epochs * steps_per_epoch_) : c.epochs * steps_per_epoch_;
  std::vector<EpochMetrics> history;
  int64_t global_step = 0;
  model_->train();
  for (int64_t epoch = 0; epoch < c.epochs && global_step < total_steps; ++epoch) {
    sampler.set_epoch(epoch);
    const auto indices = sampler.indices();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t steps = 0;
    double lr = c.lr;
    for (int64_t s = 0; s < steps_per_epoch_ && global_step < total_steps; ++s, ++steps, ++global_step) {
      std::vector<int64_t> batch(indices.begin() + s * c.batch_size, indices.begin() + (s + 1) * c.batch_size);
      auto e = train_->read(batch);
      lr = lr_at(global_step, epoch, total_steps);
      for (auto& group : opt->param_groups()) group.options().set_lr(lr);
      ddp.prepare_forward();
      auto out = model_->forward(e.inputs.to(device_));
      auto y = e.targets.to(device_);
      auto loss = classes ? torch::nn::functional::cross_entropy(out, y) : torch::mse_loss(out, y);
      ddp.backward(loss);
      opt->step();
      opt->zero_grad();
      loss_sum += loss.item<double>();
    }
    EpochMetrics m;
    m.epoch = epoch + 1;
    m.steps = steps;
    m.global_step = global_step;
    m.lr = lr;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto mean_loss = torch::tensor({steps ? loss_sum / static_cast<double>(steps) : 0.0}, torch::kDouble).to(device_);
    pg->allreduce(mean_loss, ReduceOp::kAvg);
    m.train_loss = mean_loss.cpu().item<double>();
    m.samples_per_s = static_cast<double>(steps * c.batch_size * runtime_.size()) / m.seconds;
    if (test_) std::tie(m.test_loss, m.test_accuracy) = evaluate(*pg);
    const std::string line = "[RANK " + std::to_string(runtime_.rank()) + "] Epoch " + std::to_string(epoch) +
                             " | Batchsize: " + std::to_string(c.batch_size) + " | Steps: " + std::to_string(steps);
    const auto lines = gather_strings(runtime_.world(), line);
    if (metrics.is_open()) {
      nlohmann::json j = {{"epoch", m.epoch}, {"steps", m.steps}, {"global_step", m.global_step},
                          {"train_loss", m.train_loss}, {"samples_per_s", m.samples_per_s}, {"seconds", m.seconds},
                          {"lr", m.lr}, {"world_size", runtime_.size()}};
      if (test_) j["test_loss"] = m.test_loss;
      if (test_ && classes) j["test_accuracy"] = m.test_accuracy;
      metrics << j.dump() << std::endl;
    }
    history.push_back(m);
    if (on_epoch) on_epoch(m, lines);
  }
  return history;
}

}  // namespace mpiddp
