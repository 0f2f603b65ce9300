// DDP overhead benchmark: the training step of a model with DistributedDataParallel against the
// same step with no communication (under no_sync), in alternating blocks within one run on every
// rank, so both see the same machine noise. Run by bench/ddp_bench.sh; one JSON line on rank 0.
// Where the group measures its collectives' GPU time (nccl), the line also gives, per round, that
// time per DDP step on rank 0 (device_ms). --profile PREFIX then runs one more block of each kind
// under PyTorch's profiler (Kineto): PREFIX.ddp.rankR.json and PREFIX.local.rankR.json, S steps
// each, for bench/profile_summary.py (where the DDP step's extra time goes, on the GPU and the host).
// usage: mpiddp_ddp_bench --model cnn|mlp [--steps S per block] [--rounds R] [--warmup W]
//        [--batch B] [--timeline F] [--bucket-cap-mb M] [--device cpu|cuda] [--backend mpi|nccl|gloo]
//        [--profile PREFIX]
#include <mpiddp/ddp.hpp>
#include <mpiddp/models.hpp>
#include <mpiddp/timeline.hpp>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <set>
#include <string>

namespace {

// PyTorch's profiler (host operators, and on CUDA the kernels with their GPU time) from start to
// save, which writes the Chrome trace at `path`. save throws where libtorch has no Kineto
// (Debian's 1.13).
void start_profiler(bool cuda) {
  namespace kineto = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
}
void save_profile(const std::string& path, bool cuda) {
  if (cuda) torch::cuda::synchronize();
  torch::autograd::profiler::disableProfiler()->save(path);
}

// An MLP of ~20 M parameters: 784 -> 4096 -> 4096 -> 10.
struct BigMlpImpl : torch::nn::Module {
  BigMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 4096));
    fc2 = register_module("fc2", torch::nn::Linear(4096, 4096));
    fc3 = register_module("fc3", torch::nn::Linear(4096, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x.flatten(1))))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(BigMlp);

}  // namespace

int main(int argc, char** argv) {
  mpiddp::Runtime rt(&argc, &argv);
  std::string model_name = "cnn", timeline, device_name = "cpu", backend = "mpi", profile;
  int steps = 5, warmup = 2, rounds = 6;
  int64_t batch = 64;
  double bucket_cap_mb = 25;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_name = v;
    else if (k == "--rounds") rounds = std::stoi(v);
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--batch") batch = std::stoll(v);
    else if (k == "--timeline") timeline = v;
    else if (k == "--bucket-cap-mb") bucket_cap_mb = std::stod(v);
    else if (k == "--device") device_name = v;
    else if (k == "--backend") backend = v;
    else if (k == "--profile") profile = v;
  }
  const c10::Device device = device_name == "cuda" ? rt.device() : c10::Device(c10::kCPU);
  if (device_name == "cuda" && !(device.is_cuda() && torch::cuda::is_available())) {
    if (rt.rank() == 0) std::cerr << "mpiddp_ddp_bench: --device cuda but no GPU for this rank\n";
    return 1;
  }
  torch::set_num_threads(1);  // one core per rank: these machines have as many cores as ranks
  torch::manual_seed(1);
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (model_name == "cnn") {
    mpiddp::models::MnistNet m;  // the built-in `--model cnn` (1.2 M parameters)
    module = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  } else {
    BigMlp m;
    module = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  }
  int64_t params = 0;
  for (const auto& p : module->parameters()) params += p.numel();
  module->to(device);
  auto pg = mpiddp::make_process_group(backend, rt);
  mpiddp::DdpOptions o;
  o.timeline_path = timeline;
  o.bucket_cap_bytes = static_cast<int64_t>(bucket_cap_mb * (1 << 20));
  auto ddp = std::make_unique<mpiddp::DistributedDataParallel>(module, *pg, o);
  torch::optim::SGD opt(module->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto x = torch::randn({batch, 1, 28, 28}).to(device);
  auto y = torch::randint(0, 10, {batch}, torch::kLong).to(device);
  // One training step; with `communicate` false the same step runs under no_sync: identical
  // compute, hooks and optimizer, no communication (the "no DDP" baseline).
  auto step = [&](bool communicate) {
    mpiddp::Timeline* tl = communicate ? ddp->timeline() : nullptr;
    torch::Tensor loss;
    {
      mpiddp::ScopedSpan s(tl, "forward");
      loss = torch::nn::functional::cross_entropy(forward(x), y);
    }
    if (communicate) {
      ddp->backward(loss);
    } else {
      auto guard = ddp->no_sync();
      loss.backward();
    }
    mpiddp::ScopedSpan s(tl, "optimizer step");
    opt.step();
    opt.zero_grad();
  };
  // A block's time is its mean step time on the slowest rank (on a GPU: until its kernels end).
  auto settle = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  std::vector<double> device_ms;  // the collectives' GPU time per step of each DDP block
  auto block = [&](bool communicate) {
    settle();
    pg->barrier();
    const auto device0 = pg->device_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step(communicate);
    settle();
    double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    if (communicate && device0) device_ms.push_back((*pg->device_seconds() - *device0) * 1e3 / steps);
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, rt.world());
    return t;
  };
  for (int i = 0; i < warmup; ++i) {
    step(true);
    step(false);
  }
  // Alternating blocks see the same machine noise; the ratio is taken per round.
  std::vector<double> local, with_ddp;
  for (int r = 0; r < rounds; ++r) {
    const bool ddp_first = r % 2 == 1;
    const double a = block(ddp_first);
    const double b = block(!ddp_first);
    with_ddp.push_back(ddp_first ? a : b);
    local.push_back(ddp_first ? b : a);
  }
  if (rt.rank() == 0) {
    auto list = [](const std::vector<double>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    std::cout << "{\"model\": \"" << model_name << "\", \"device\": \"" << device.str() << "\", \"backend\": \""
              << backend << "\", \"params\": " << params << ", \"batch_per_rank\": " << batch
              << ", \"ranks\": " << rt.size() << ", \"steps_per_block\": " << steps << ", \"local_ms\": " << list(local)
              << ", \"ddp_ms\": " << list(with_ddp) << ", \"buckets\": " << ddp->buckets().size();
    if (!device_ms.empty()) std::cout << ", \"device_ms\": " << list(device_ms);
    std::cout << "}" << std::endl;
  }
  // Each profiled block is a collective step (its barrier, its time's all-reduce): every rank learns
  // whether all could start and save their profiles before going on; a rank that could not says why.
  auto agreed = [&](const std::function<void()>& part) {
    int failed = 0;
    try {
      part();
    } catch (const std::exception& e) {
      const std::string what = e.what();  // libtorch's first line, without its backtrace
      std::cerr << "mpiddp_ddp_bench: [rank " << rt.rank() << "] --profile: " << what.substr(0, what.find('\n')) << "\n";
      failed = 1;
    }
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, rt.world());
    return failed == 0;
  };
  bool profiled = true;
  for (const bool communicate : {true, false}) {
    if (profile.empty() || !profiled) break;
    const auto path = mpiddp::Timeline::rank_path(profile + (communicate ? ".ddp.json" : ".local.json"), rt.rank());
    profiled = agreed([&] { start_profiler(device.is_cuda()); });
    if (!profiled) break;
    block(communicate);
    profiled = agreed([&] { save_profile(path, device.is_cuda()); });
  }
  ddp.reset();
  pg.reset();
  rt.close();
  return profiled ? 0 : 1;
}
