// The proof: K optimizer steps with N ranks x batch B give the parameters of 1 process x batch
// N*B (float32, max relative error <= 1e-5), for N = 1..4, on several models and options.
#include <mpiddp/ddp.hpp>
#include <mpiddp/zero.hpp>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>

#include "mpi_test.hpp"
#include "test_models.hpp"
#include "train/step_agreement.hpp"

using mpiddp::testing::on_all_ranks;
using mpiddp::testing::runtime;

namespace {

constexpr int kSteps = 4;
constexpr int64_t kBatch = 3;  // per rank; odd on purpose

// ---- models ----------------------------------------------------------------------------

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden = 32, bool with_unused = false, bool freeze_first = false) {
    fc1 = register_module("fc1", torch::nn::Linear(20, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(16, 16));
    if (freeze_first) {
      for (auto& p : fc1->parameters()) p.set_requires_grad(false);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, unused{nullptr};
};
TORCH_MODULE(Mlp);

using CnnImpl = mpiddp::testing::SmallCnnImpl;
using Cnn = mpiddp::testing::SmallCnn;

struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(20, 32));
    bn = register_module("bn", torch::nn::BatchNorm1d(32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnNet);

// ---- data: the same global batch on every rank, from the step number ---------------------

struct Batch {
  torch::Tensor x, y;
};

Batch global_batch(int step, int64_t samples, bool images) {
  torch::manual_seed(1000 + step);
  Batch b;
  if (images) {
    b.x = torch::randn({samples, 1, 28, 28});
    b.y = torch::randint(0, 10, {samples}, torch::kLong);
  } else {
    b.x = torch::randn({samples, 20});
    b.y = torch::randn({samples, 4});
  }
  return b;
}

Batch shard(const Batch& b, int rank, int64_t per_rank) {
  return {b.x.narrow(0, rank * per_rank, per_rank), b.y.narrow(0, rank * per_rank, per_rank)};
}

template <typename Model>
torch::Tensor loss_of(Model& m, const Batch& b, bool images) {
  auto out = m->forward(b.x);
  return images ? torch::nn::functional::cross_entropy(out, b.y) : torch::mse_loss(out, b.y);
}

// Max over parameters of max|a-b| / max(max|b|, 1e-12).
double max_rel_error(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = pa.size() == pb.size() ? 0.0 : 1e9;
  for (size_t i = 0; i < std::min(pa.size(), pb.size()); ++i) {
    const double scale = std::max(pb[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

mpiddp::ProcessGroup& group(const std::string& backend) { return mpiddp::testing::checked_group(backend); }

struct RunSpec {
  std::string backend = "mpi";
  c10::Device device = c10::kCPU;  // of both models and the data
  mpiddp::DdpOptions ddp;
  int accumulation = 1;  // micro-batches per step (no_sync for all but the last)
  bool images = false;
  double lr = 0.1;
  bool adam = false;
  // How gradients are cleared after each step: the optimizer's zero_grad() (libtorch 1.13: in
  // place), ddp.zero_grad(), every .grad reset to undefined (zero_grad(set_to_none) in libtorch 2),
  // or not at all (both runs then accumulate gradients across steps).
  enum class Zero { kOptimizer, kDdp, kSetToNone, kNever } zero = Zero::kOptimizer;
  // How backward is called: the plain PyTorch way (loss.backward() alone), ddp.backward(loss), or
  // loss.backward() followed by ddp.finish_backward() (the API before reductions completed inside
  // backward; still accepted).
  enum class Api { kPlain, kDdpBackward, kFinishBackward } api = Api::kPlain;
};

template <typename Model>
void clear_gradients(RunSpec::Zero how, torch::optim::Optimizer& opt, Model& model,
                     mpiddp::DistributedDataParallel* ddp) {
  switch (how) {
    case RunSpec::Zero::kOptimizer:
      opt.zero_grad();
      break;
    case RunSpec::Zero::kDdp:
      if (ddp)
        ddp->zero_grad();
      else
        opt.zero_grad();
      break;
    case RunSpec::Zero::kSetToNone:
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      break;
    case RunSpec::Zero::kNever:
      break;
  }
}

// Trains `make()` with DDP on this rank's shards and a reference copy on the whole global batch;
// returns the max relative parameter error after kSteps.
template <typename Make>
double ddp_vs_single(const RunSpec& spec, Make make, mpiddp::DdpStats* stats = nullptr) {
  auto& pg = group(spec.backend);
  const int r = pg.rank(), n = pg.size();
  torch::manual_seed(7);
  auto model = make();
  torch::manual_seed(7);
  auto reference = make();
  // Rank-specific perturbation: DDP's initial broadcast must undo it.
  {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(0.01 * r);
  }
  model->to(spec.device);
  reference->to(spec.device);
  mpiddp::DistributedDataParallel ddp(model.ptr(), pg, spec.ddp);
  auto make_opt = [&](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (spec.adam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(spec.lr));
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(spec.lr).momentum(0.9));
  };
  auto opt = make_opt(model->parameters());
  auto ref_opt = make_opt(reference->parameters());
  const int64_t per_step = kBatch * spec.accumulation;
  for (int step = 0; step < kSteps; ++step) {
    Batch all = global_batch(step, per_step * n, spec.images);
    all = {all.x.to(spec.device), all.y.to(spec.device)};
    // DDP: micro-batch m of rank r is rows [(m*n + r)*B, +B) of the global batch.
    for (int m = 0; m < spec.accumulation; ++m) {
      const Batch micro = shard(all, m * n + r, kBatch);
      auto loss = loss_of(model, micro, spec.images) / spec.accumulation;
      std::optional<mpiddp::DistributedDataParallel::NoSync> guard;
      if (m + 1 < spec.accumulation) guard.emplace(&ddp);
      switch (spec.api) {
        case RunSpec::Api::kPlain:
          loss.backward();
          break;
        case RunSpec::Api::kDdpBackward:
          ddp.backward(loss);
          break;
        case RunSpec::Api::kFinishBackward:
          loss.backward();
          ddp.finish_backward();
          break;
      }
    }
    opt->step();
    clear_gradients(spec.zero, *opt, model, &ddp);
    // Reference: one process, the whole global batch at once.
    auto ref_loss = loss_of(reference, all, spec.images);
    ref_loss.backward();
    ref_opt->step();
    clear_gradients(spec.zero, *ref_opt, reference, nullptr);
  }
  if (stats) *stats = ddp.stats();
  return max_rel_error(*model, *reference);
}

}  // namespace

TEST(Ddp, MlpMatchesSingleProcessOnEveryBackend) {
  auto backends = mpiddp::available_backends();
  backends.emplace_back("mpi_staged");
  for (const auto& backend : backends) {
    if (backend == "nccl") continue;  // CUDA: tests run on the GPU machine (issue 8)
    RunSpec spec;
    spec.backend = backend;
    const double err = ddp_vs_single(spec, [] { return Mlp(); });
    EXPECT_LE(err, 1e-5) << backend;
    MPIDDP_EXPECT_ALL(err <= 1e-5);
  }
}

// On the GPU: parameters, gradients and buckets on CUDA, through nccl (one GPU per rank) and the
// mpi group (ranks may share a GPU; CUDA-aware MPI or staged through the host).
TEST(DdpCuda, MlpMatchesSingleProcess) {
  MPIDDP_SKIP_WITHOUT_GPU();
  mpiddp::testing::float32_on_gpu();
  for (const auto& backend : mpiddp::testing::cuda_backends()) {
    RunSpec spec;
    spec.backend = backend;
    spec.device = runtime().device();
    const double err = ddp_vs_single(spec, [] { return Mlp(); });
    EXPECT_LE(err, 1e-5) << backend;
    MPIDDP_EXPECT_ALL(err <= 1e-5);
  }
}

TEST(DdpCuda, CnnWithAdamMatchesSingleProcess) {
  MPIDDP_SKIP_WITHOUT_GPU();
  mpiddp::testing::float32_on_gpu();
  RunSpec spec;
  spec.images = true;
  spec.adam = true;
  spec.lr = 1e-3;
  spec.device = runtime().device();
  const double err = ddp_vs_single(spec, [] { return Cnn(); });
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5);
}

TEST(Ddp, CnnMatchesSingleProcess) {
  RunSpec spec;
  spec.images = true;
  spec.lr = 0.05;
  const double err = ddp_vs_single(spec, [] { return Cnn(); });
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5);
}

TEST(Ddp, AdamMatchesSingleProcess) {
  RunSpec spec;
  spec.adam = true;
  spec.lr = 1e-2;
  const double err = ddp_vs_single(spec, [] { return Mlp(); });
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5);
}

TEST(Ddp, GradientAccumulationWithNoSync) {
  RunSpec spec;
  spec.accumulation = 3;
  mpiddp::DdpStats stats;
  const double err = ddp_vs_single(
      spec, [] { return Mlp(); }, &stats);
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5 && stats.steps == kSteps);  // one reduction per step, not per micro-batch
}

TEST(Ddp, EveryWayOfClearingGradientsMatchesSingleProcess) {
  // After a step .grad is an alias of the bucket; each way of clearing it (or none: gradients
  // summed over steps) must give the single process's parameters, with plain steps and with
  // no_sync accumulation, through ddp.backward() and through loss.backward() + finish_backward().
  using Z = RunSpec::Zero;
  using A = RunSpec::Api;
  for (Z zero : {Z::kOptimizer, Z::kDdp, Z::kSetToNone, Z::kNever}) {
    for (int accumulation : {1, 2}) {
      for (A api : {A::kPlain, A::kDdpBackward, A::kFinishBackward}) {
        RunSpec spec;
        spec.zero = zero;
        spec.accumulation = accumulation;
        spec.api = api;
        spec.lr = 0.02;
        const double err = ddp_vs_single(spec, [] { return Mlp(32, /*with_unused=*/true); });
        EXPECT_LE(err, 1e-5) << "zero " << static_cast<int>(zero) << " accumulation " << accumulation << " api "
                             << static_cast<int>(api);
        MPIDDP_EXPECT_ALL(err <= 1e-5);
      }
    }
  }
}

TEST(Ddp, GradientsAreTheBucketNotCopies) {
  // One bucket: after each step every .grad lies in one buffer, in reverse registration order,
  // back to back, at the same address every step (no copy back from the bucket).
  auto& pg = group("mpi");
  torch::manual_seed(7);
  Mlp model;
  mpiddp::DdpOptions o;
  o.bucket_cap_bytes = o.first_bucket_cap_bytes = int64_t{1} << 30;
  mpiddp::DistributedDataParallel ddp(model.ptr(), pg, o);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  auto params = model->parameters();
  std::vector<const void*> first;
  bool same = true, packed = true;
  for (int step = 0; step < 3; ++step) {
    const Batch b = shard(global_batch(step, kBatch * pg.size(), false), pg.rank(), kBatch);
    ddp.backward(loss_of(model, b, false));
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      const auto* later = static_cast<const char*>(params[i + 1].grad().data_ptr());
      packed = packed && static_cast<const char*>(params[i].grad().data_ptr()) ==
                             later + params[i + 1].numel() * static_cast<int64_t>(sizeof(float));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (step == 0) first.push_back(params[i].grad().data_ptr());
      same = same && first[i] == params[i].grad().data_ptr();
    }
    opt.step();
    opt.zero_grad();
  }
  EXPECT_TRUE(packed);
  EXPECT_TRUE(same);
  MPIDDP_EXPECT_ALL(packed && same);
}

TEST(Ddp, UnusedParameterDoesNotHang) {
  RunSpec spec;
  mpiddp::DdpStats stats;
  const double err = ddp_vs_single(
      spec, [] { return Mlp(32, /*with_unused=*/true); }, &stats);
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5 && stats.buckets_launched_at_end > 0);
}

// Passes its input through in forward and throws in backward: a backward pass that fails midway,
// after the layers above it have delivered their gradients (and their buckets may be in flight).
struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 const torch::autograd::variable_list&) {
    throw std::runtime_error("backward failed on purpose");
  }
};

TEST(Ddp, BackwardThatThrowsLeavesDdpUsable) {
  // The plain PyTorch loop; at step 2 backward throws on every rank after fc3's gradients arrived
  // (small buckets: fc3's are launched before the throw). The caller catches, skips the step and
  // goes on; the result must equal one process that never took step 2.
  auto& pg = group("mpi");
  const int r = pg.rank(), n = pg.size();
  constexpr int kThrowAt = 2, kTotal = 5;
  torch::manual_seed(7);
  Mlp model;
  torch::manual_seed(7);
  Mlp reference;
  mpiddp::DdpOptions o;
  o.bucket_cap_bytes = o.first_bucket_cap_bytes = 256;
  mpiddp::DistributedDataParallel ddp(model.ptr(), pg, o);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  bool threw = false, settled = false;
  for (int step = 0; step < kTotal; ++step) {
    const Batch all = global_batch(step, kBatch * n, false);
    const Batch mine = shard(all, r, kBatch);
    opt.zero_grad();
    if (step == kThrowAt) {
      const int64_t launched_before = ddp.stats().buckets_launched_early;
      auto h = ThrowInBackward::apply(torch::relu(model->fc2(torch::relu(model->fc1(mine.x)))));
      try {
        torch::mse_loss(model->fc3(h), mine.y).backward();
      } catch (const std::exception& e) {
        threw = std::string(e.what()).find("backward failed on purpose") != std::string::npos;
      }
      // Settled while autograd unwound, before the caller touches a gradient.
      // fc3's buckets were in flight when it threw.
      settled = ddp.stats().aborted_passes == 1 && ddp.stats().buckets_launched_early > launched_before;
      continue;
    }
    loss_of(model, mine, false).backward();
    opt.step();
    ref_opt.zero_grad();
    loss_of(reference, all, false).backward();
    ref_opt.step();
  }
  const double err = max_rel_error(*model, *reference);
  EXPECT_TRUE(threw);
  EXPECT_TRUE(settled);
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(threw && settled && err <= 1e-5 && ddp.stats().steps == kTotal - 1);
}

TEST(Ddp, FrozenParametersSkippedConsistently) {
  RunSpec spec;
  const double err = ddp_vs_single(spec, [] { return Mlp(32, false, /*freeze_first=*/true); });
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5);
}

TEST(Ddp, StartsFromRankZerosValuesWhateverTheirSizes) {
  // The start-up broadcast packs tensors into chunks of at most 25 MiB: parameters above that alone
  // (a contiguous one in place, a transposed one through a copy), three of 12 MiB (two share a
  // chunk), small ones and a buffer of another dtype between them. Every rank starts from values of
  // its own; afterwards each holds what rank 0 held (compared exactly with rank 0's formula).
  for (const auto& backend : mpiddp::available_backends()) {
    if (backend == "nccl") continue;  // CUDA: tests run on the GPU machine
    auto& pg = group(backend);
    const auto values = [](int64_t numel, int rank, int index) {
      return torch::arange(numel, torch::kFloat32).remainder(1000 + index) + 10000.0 * rank;
    };
    const std::vector<std::vector<int64_t>> shapes = {{7, 1 << 20}, {3 << 20}, {5, 3}, {3 << 20},
                                                      {2600, 3000}, {3 << 20}, {1}};
    std::vector<std::pair<std::string, torch::Tensor>> params;
    std::vector<torch::Tensor> expected;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t numel = c10::multiply_integers(shapes[i]);
      auto mine = values(numel, pg.rank(), static_cast<int>(i)).reshape(shapes[i]);
      auto wanted = values(numel, 0, static_cast<int>(i)).reshape(shapes[i]);
      if (i == 4) {  // transposed: not contiguous
        mine = mine.t().contiguous().t();
        wanted = wanted.t().contiguous().t();
      }
      params.emplace_back("p" + std::to_string(i), mine.detach().requires_grad_());
      expected.push_back(wanted);
    }
    ASSERT_FALSE(params[4].second.is_contiguous());
    auto buffer = torch::full({4}, 1.0 + pg.rank(), torch::kFloat64);
    mpiddp::DistributedDataParallel ddp(params, {{"b", buffer}}, pg);
    bool equal = buffer.equal(torch::full({4}, 1.0, torch::kFloat64));
    for (size_t i = 0; i < params.size(); ++i) equal = equal && params[i].second.detach().equal(expected[i]);
    EXPECT_TRUE(equal) << backend;
    MPIDDP_EXPECT_ALL(equal);
  }
}

TEST(Ddp, MeanTailRidesWithTheGradients) {
  // DdpOptions::mean_tail_values: after a reducing backward the mean tail holds the mean over the ranks
  // of what each rank wrote (reference: a direct MPI_Allreduce of the same values), the
  // gradients are untouched by them (the DDP run still matches one process), with several
  // buckets, one, compressed on the wire, with no trainable parameter at all, and beside ZeRO-2's
  // reduce-scattered buckets.
  for (const auto& backend : mpiddp::available_backends()) {
    if (backend == "nccl") continue;  // CUDA: tests run on the GPU machine
    for (int variant = 0; variant < 5; ++variant) {
      auto& pg = group(backend);
      const int r = pg.rank(), n = pg.size();
      if (variant == 2 && !pg.supports(mpiddp::Collective::kAllreduce, c10::kBFloat16, mpiddp::ReduceOp::kSum)) {
        continue;  // this gloo has no bfloat16 (refusals are tested in test_comm_mpi)
      }
      mpiddp::DdpOptions o;
      o.mean_tail_values = 3;
      if (variant == 0) o.bucket_cap_bytes = o.first_bucket_cap_bytes = 256;  // several buckets
      if (variant == 2) o.compression = c10::kBFloat16;
      if (variant == 4) o.reduction = mpiddp::zero_reduction(2);  // reduce-scattered buckets: the tail travels alone
      torch::manual_seed(7);
      Mlp model(32, false, /*freeze_first=*/false);
      if (variant == 3) {
        for (auto& p : model->parameters()) p.set_requires_grad(false);
      }
      mpiddp::DistributedDataParallel ddp(model.ptr(), pg, o);
      const bool ok_shape = ddp.mean_tail().defined() && ddp.mean_tail().numel() == 3;
      MPIDDP_EXPECT_ALL(ok_shape);
      if (!ok_shape) continue;
      for (int step = 0; step < 3; ++step) {
        // Small integers and halves: exact in bfloat16 too, so the mean is exact on every variant.
        const std::vector<float> mine = {static_cast<float>(r + 1), static_cast<float>(r * step % 3),
                                         0.5F * static_cast<float>(r == 0)};
        std::vector<float> sum(3);
        MPI_Allreduce(mine.data(), sum.data(), 3, MPI_FLOAT, MPI_SUM, runtime().world());
        ddp.mean_tail().copy_(torch::tensor(mine));
        if (variant == 3) {
          ddp.finish_backward();  // no parameter to take a gradient: the tail travels alone
        } else {
          const Batch b = shard(global_batch(step, kBatch * n, false), r, kBatch);
          ddp.backward(loss_of(model, b, false));
        }
        auto got = ddp.mean_tail().to(torch::kFloat).contiguous();
        bool same = true;
        for (int i = 0; i < 3; ++i) same = same && got[i].item<float>() == sum[i] / static_cast<float>(n);
        EXPECT_TRUE(same) << backend << " variant " << variant << " step " << step << ": " << got;
        MPIDDP_EXPECT_ALL(same);
        ddp.zero_grad();
        MPIDDP_EXPECT_ALL(ddp.mean_tail().abs().sum().item<double>() == 0);
      }
    }
  }
  // The gradients themselves are still the single-process ones with the tail beside them.
  RunSpec spec;
  spec.ddp.mean_tail_values = 2;
  spec.ddp.bucket_cap_bytes = spec.ddp.first_bucket_cap_bytes = 256;
  const double err = ddp_vs_single(spec, [] { return Mlp(); });
  EXPECT_LE(err, 1e-5);
  MPIDDP_EXPECT_ALL(err <= 1e-5);
  // A negative count is refused on every rank, before any collective.
  mpiddp::DdpOptions bad;
  bad.mean_tail_values = -1;
  torch::manual_seed(7);
  Mlp m;
  std::string what;
  try {
    mpiddp::DistributedDataParallel ddp(m.ptr(), group("mpi"), bad);
  } catch (const mpiddp::Error& e) {
    what = e.what();
  }
  MPIDDP_EXPECT_ALL(what.find("mean_tail_values must be in [0, 2^20], got -1") != std::string::npos);
}

TEST(Ddp, EveryBucketCapGivesTheSameParameters) {
  // From one bucket per parameter up to everything in one bucket.
  for (int64_t cap : {int64_t{1}, int64_t{256}, int64_t{2048}, int64_t{1} << 30}) {
    RunSpec spec;
    spec.ddp.bucket_cap_bytes = cap;
    spec.ddp.first_bucket_cap_bytes = std::min<int64_t>(cap, 1 << 20);
    mpiddp::DdpStats stats;
    const double err = ddp_vs_single(
        spec, [] { return Mlp(); }, &stats);
    EXPECT_LE(err, 1e-5) << "cap " << cap;
    // Every bucket started from a gradient hook, during backward: communication overlapped.
    MPIDDP_EXPECT_ALL(err <= 1e-5 && stats.buckets_launched_at_end == 0 && stats.buckets_launched_early > 0);
  }
}

TEST(Ddp, BucketLayoutFollowsTheCaps) {
  auto& pg = group("mpi");
  torch::manual_seed(7);
  Mlp m;
  auto count = [&](int64_t cap, int64_t first) {
    mpiddp::DdpOptions o;
    o.bucket_cap_bytes = cap;
    o.first_bucket_cap_bytes = first;
    mpiddp::DistributedDataParallel ddp(m.ptr(), pg, o);
    return ddp.buckets().size();
  };
  // 6 parameters: one bucket each with a 1-byte cap, one in all with a huge cap.
  MPIDDP_EXPECT_ALL(count(1, 1) == 6 && count(int64_t{1} << 30, int64_t{1} << 30) == 1);
}

TEST(Ddp, BatchNormMatchesPerShardStatistics) {
  // What holds for BatchNorm: each rank normalises with its own shard's batch statistics (as
  // PyTorch DDP without SyncBatchNorm), so the reference is one process that runs each shard
  // through the model separately and averages the losses; running statistics are rank 0's,
  // broadcast at the end of every reducing backward, so the reference keeps those of shard 0.
  auto& pg = group("mpi");
  const int r = pg.rank(), n = pg.size();
  torch::manual_seed(7);
  BnNet model;
  torch::manual_seed(7);
  BnNet reference;
  mpiddp::DistributedDataParallel ddp(model.ptr(), pg);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::Tensor stats_after_shard0_mean, stats_after_shard0_var;
  for (int step = 0; step < kSteps; ++step) {
    const Batch all = global_batch(step, kBatch * n, false);
    opt.zero_grad();
    loss_of(model, shard(all, r, kBatch), false).backward();  // no DDP call: buffers follow rank 0 by themselves
    opt.step();

    torch::Tensor ref_loss;
    for (int q = 0; q < n; ++q) {
      auto l = loss_of(reference, shard(all, q, kBatch), false) / n;
      if (q == 0) {
        stats_after_shard0_mean = reference->bn->running_mean.clone();
        stats_after_shard0_var = reference->bn->running_var.clone();
      }
      ref_loss = ref_loss.defined() ? ref_loss + l : l;
    }
    ref_loss.backward();  // before the restore below: BatchNorm's backward checks its saved inputs
    {
      torch::NoGradGuard g;
      reference->bn->running_mean.copy_(stats_after_shard0_mean);
      reference->bn->running_var.copy_(stats_after_shard0_var);
    }
    ref_opt.step();
    ref_opt.zero_grad();
  }
  const double err = max_rel_error(*model, *reference);
  EXPECT_LE(err, 1e-5);
  // Every reducing backward ends with rank 0's buffers on every rank: after the last step all
  // ranks hold the statistics of shard 0, as the reference does.
  const bool stats_ok = torch::allclose(model->bn->running_mean, reference->bn->running_mean, 1e-5, 1e-6) &&
                        torch::allclose(model->bn->running_var, reference->bn->running_var, 1e-5, 1e-6);
  EXPECT_TRUE(stats_ok);
  MPIDDP_EXPECT_ALL(err <= 1e-5 && stats_ok);
}

TEST(Ddp, CompressedGradientsStayClose) {
  // bfloat16 keeps 8 significant bits and float16 11: the reduced gradients carry a relative
  // error up to ~2^-8 and ~2^-11, so after 4 SGD steps parameters agree to within 1e-2 (bf16)
  // and 2e-3 (fp16) relative, not 1e-5.
  for (auto [dtype, tol] : {std::pair<c10::ScalarType, double>{c10::kBFloat16, 1e-2}, {c10::kHalf, 2e-3}}) {
    RunSpec spec;
    spec.ddp.compression = dtype;
    const double err = ddp_vs_single(spec, [] { return Mlp(); });
    EXPECT_LE(err, tol) << mpiddp::dtype_name(dtype);
    MPIDDP_EXPECT_ALL(err <= tol);
  }
}

TEST(Ddp, ModelMismatchReportedNotHung) {
  auto& pg = group("mpi");
  if (pg.size() < 2) GTEST_SKIP() << "needs two ranks";
  torch::manual_seed(7);
  Mlp m(pg.rank() == 1 ? 33 : 32);
  std::string what;
  try {
    mpiddp::DistributedDataParallel ddp(m.ptr(), pg);
  } catch (const mpiddp::Error& e) {
    what = e.message();
  }
  const std::string want =
      "model mismatch across ranks: parameter 0 is 'fc1.weight:float32[33,20]' on rank 1 but "
      "'fc1.weight:float32[32,20]' on rank 0 (6 vs 6 trainable parameters)";
  EXPECT_EQ(what, want);
  MPIDDP_EXPECT_ALL(what == want);
  // Different parameter counts are named too.
  Mlp k(32, /*with_unused=*/pg.rank() == 1);
  what.clear();
  try {
    mpiddp::DistributedDataParallel ddp(k.ptr(), pg);
  } catch (const mpiddp::Error& e) {
    what = e.message();
  }
  MPIDDP_EXPECT_ALL(what.find("(8 vs 6 trainable parameters)") != std::string::npos);
}

TEST(Ddp, TimelineHasEveryBucketAndBackward) {
  auto& pg = group("mpi");
  const std::string base = ::testing::TempDir() + "mpiddp_timeline_np" + std::to_string(pg.size()) + ".json";
  size_t n_buckets = 0;
  {
    torch::manual_seed(7);
    Mlp m;
    mpiddp::DdpOptions o;
    o.timeline_path = base;
    o.bucket_cap_bytes = 1024;
    o.first_bucket_cap_bytes = 256;
    mpiddp::DistributedDataParallel ddp(m.ptr(), pg, o);
    n_buckets = ddp.buckets().size();
    for (int step = 0; step < 2; ++step) {
      ddp.prepare_forward();
      ddp.backward(torch::mse_loss(m->forward(torch::randn({4, 20})), torch::zeros({4, 4})));
    }
  }
  bool ok = false;
  try {
    std::ifstream in(mpiddp::Timeline::rank_path(base, pg.rank()));
    auto doc = nlohmann::json::parse(in);
    size_t allreduces = 0, backwards = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const std::string name = e["name"];
      if (name.rfind("allreduce bucket", 0) == 0 && e["tid"] == 1 && e["dur"].get<double>() >= 0) ++allreduces;
      if (name == "backward") ++backwards;
    }
    ok = allreduces == 2 * n_buckets && backwards == 2 && n_buckets > 1;
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  MPIDDP_EXPECT_ALL(ok);
}

// The step agreement (src/train/step_agreement.hpp) both ways it posts: straight into CPU float32
// slots, or judged where the loss is (any other slots: float64 here, as a GPU's are on the device,
// where posting must not wait for the forward). A NaN loss on one rank names that rank on every rank
// after the slots' all-reduce (the gradient collective's mean); finite losses name none.
TEST(StepAgreement, NamesTheRankWithABadLossEitherWay) {
  auto& pg = mpiddp::testing::checked_group("mpi");
  const int bad_rank = std::min(1, pg.size() - 1);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto slots = torch::zeros({mpiddp::detail::StepAgreement::kSlots}, dtype);
    mpiddp::detail::StepAgreement agreement(slots, pg);
    for (const bool bad : {false, true, false}) {
      const double loss = bad && pg.rank() == bad_rank ? std::numeric_limits<double>::quiet_NaN() : 2.5;
      agreement.post(torch::tensor(loss, torch::kDouble));
      pg.allreduce(slots, mpiddp::ReduceOp::kAvg);
      const auto verdict = agreement.settle();
      EXPECT_EQ(verdict.bad_rank, bad ? bad_rank : -1) << c10::toString(dtype) << (bad ? ", a NaN" : ", finite");
      EXPECT_EQ(verdict.stop_signal, 0) << c10::toString(dtype);
    }
  }
}
