// Every collective x backend x dtype x op, in place and out of place, at odd counts, against
// values each rank computes by formula (the collective harness's rows). Runs at 1..4 ranks; groups
// run in check mode.
#include <mpiddp/config.hpp>
#include <mpiddp/process_group.hpp>

#include <torch/torch.h>

#include <map>
#if MPIDDP_HAS_NCCL
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#endif
#include <sstream>
#include <tuple>
#include <vector>

#include "comm/collective_harness.hpp"
#include "comm/names.hpp"
#include "mpi_test.hpp"

using mpiddp::Collective;
using mpiddp::ReduceOp;
using mpiddp::testing::on_all_ranks;
using mpiddp::testing::runtime;

namespace {

mpiddp::ProcessGroup& group(const std::string& backend) { return mpiddp::testing::checked_group(backend); }

// Runs `kind` through the collective harness (comm/collective_harness.hpp: the row's ProcessGroup
// call, its pattern input and closed-form output) at `count` elements a rank's part (allgather's
// input, reduce_scatter's output, alltoall's slice; the whole array otherwise), once per root for a
// rooted collective (the first rank and the last), ended by wait() or by wait_on_device() (nccl: the
// device waits, not the host, and the check's read queues behind it); returns the number of wrong
// elements on this rank.
int64_t run_case(mpiddp::ProcessGroup& pg, Collective kind, c10::ScalarType dtype, ReduceOp op, bool in_place,
                 int64_t count, c10::Device dev = c10::kCPU, bool on_device = false) {
  const auto& t = mpiddp::traits(kind);
  const int n = pg.size();
  const int64_t elements = t.splits() ? n * count : count;
  const auto options = torch::TensorOptions().dtype(dtype).device(dev);
  int64_t wrong = 0;
  for (int root : t.rooted ? std::vector<int>{0, n - 1} : std::vector<int>{0}) {
    const auto buffers = mpiddp::detail::make_buffers(kind, elements, options, in_place, pg.rank(), n);
    wrong += mpiddp::detail::verify(pg, kind, buffers, {op, root}, on_device);
  }
  return wrong;
}

// nccl needs one GPU per rank and a CUDA build of libtorch; every rank reaches the same answer.
bool nccl_usable() { return mpiddp::testing::cuda_on_all_ranks() && mpiddp::testing::gpu_per_rank(); }

// Under MPIDDP_REQUIRE_GPU=1, an unusable nccl is a failure unless ranks share a GPU (which NCCL
// cannot serve at all).
bool nccl_required() { return mpiddp::testing::gpu_required() && mpiddp::testing::gpu_per_rank(); }

std::vector<std::string> cpu_backends() {
  std::vector<std::string> b;
  for (const auto& name : mpiddp::available_backends()) {
    if (name != "nccl") b.push_back(name);
  }
  return b;
}

using Case = std::tuple<std::string, Collective, c10::ScalarType, ReduceOp, bool>;

// A case's backend names the group and the tensors' device: "nccl" (CUDA), "mpi_cuda" (the mpi
// group with CUDA tensors: CUDA-aware MPI or staged through the host), "mpi_staged" (CPU tensors
// through the staged path), or a CPU group.
std::vector<std::string> case_backends() {
  std::vector<std::string> b = mpiddp::available_backends();
  b.emplace_back("mpi_staged");
  b.emplace_back("mpi_cuda");
  return b;
}

bool on_cuda(const std::string& case_backend) { return case_backend == "nccl" || case_backend == "mpi_cuda"; }
std::string group_name(const std::string& case_backend) { return case_backend == "mpi_cuda" ? "mpi" : case_backend; }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& backend : case_backends()) {
    for (const auto& t : mpiddp::collectives()) {
      if (!t.has_data()) continue;
      const auto kind = t.kind;
      const bool reduces = t.reduces;
      for (auto dtype : mpiddp::detail::collective_dtypes()) {
        for (auto op : mpiddp::detail::reduce_ops()) {
          if (!reduces && op != ReduceOp::kSum) continue;
          for (bool in_place : {false, true}) cases.emplace_back(backend, kind, dtype, op, in_place);
        }
      }
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [backend, kind, dtype, op, in_place] = info.param;
  std::string name = backend + "_" + mpiddp::to_string(kind) + "_" + mpiddp::dtype_name(dtype);
  if (mpiddp::traits(kind).reduces) name += "_" + mpiddp::to_string(op);
  return name + (in_place ? "_inplace" : "_outofplace");
}

class CollectiveTest : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(CollectiveTest, MatchesFormula) {
  const auto& [backend, kind, dtype, op, in_place] = GetParam();
  if (backend == "nccl" && !nccl_usable()) {
    if (nccl_required()) FAIL() << "MPIDDP_REQUIRE_GPU=1 but the nccl backend is unusable";
    GTEST_SKIP() << "nccl needs one GPU per rank and a CUDA libtorch";
  }
  if (backend == "mpi_cuda") MPIDDP_SKIP_WITHOUT_GPU();
  const c10::Device dev = on_cuda(backend) ? runtime().device() : c10::Device(c10::kCPU);
  auto& pg = group(group_name(backend));
  if (!pg.supports(kind, dtype, op)) {
    // Unsupported combinations are a clear error on every rank, raised before anything is sent.
    bool refused = false;
    try {
      run_case(pg, kind, dtype, op, in_place, 7, dev);
    } catch (const mpiddp::Error& e) {
      refused = std::string(e.what()).find("does not support") != std::string::npos;
    }
    MPIDDP_EXPECT_ALL(refused);
    return;
  }
  for (int64_t count : mpiddp::detail::kCheckCounts) {
    int64_t wrong = -1;
    std::string error;
    try {
      wrong = run_case(pg, kind, dtype, op, in_place, count, dev,
                       /*on_device=*/count == mpiddp::detail::kCheckCounts.back());
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "");
    EXPECT_EQ(wrong, 0) << "count " << count;
    MPIDDP_ASSERT_ALL(wrong == 0 && error.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(All, CollectiveTest, ::testing::ValuesIn(all_cases()), case_name);

TEST(Comm, BarrierAndSequenceNumbers) {
  for (const auto& backend : cpu_backends()) {
    auto& pg = group(backend);
    const uint64_t before = pg.sequence();
    pg.barrier();
    pg.barrier();
    MPIDDP_EXPECT_ALL(pg.sequence() == before + 2);
  }
}

TEST(Comm, ManyOutstandingWaitedInReverse) {
  for (const auto& backend : cpu_backends()) {
    auto& pg = group(backend);
    std::vector<torch::Tensor> ts;
    std::vector<mpiddp::WorkHandle> works;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(torch::full({37 + k}, static_cast<float>(pg.rank() + k), torch::kFloat));
      works.push_back(pg.allreduce_async(ts.back(), ts.back(), ReduceOp::kSum));
    }
    for (int k = 5; k >= 0; --k) works[static_cast<size_t>(k)]->wait();
    const int n = pg.size();
    bool ok = true;
    for (int k = 0; k < 6; ++k) {
      ok = ok && ts[static_cast<size_t>(k)].eq(static_cast<float>(n * (n - 1) / 2 + n * k)).all().item<bool>();
    }
    MPIDDP_EXPECT_ALL(ok);
  }
}

TEST(Comm, TestPollsToCompletion) {
  auto& pg = group("mpi");
  auto t = torch::ones({1 << 16}, torch::kFloat);
  auto w = pg.allreduce_async(t, t, ReduceOp::kMax);
  while (!w->test()) {
  }
  MPIDDP_EXPECT_ALL(w->is_completed() && t.eq(1.0f).all().item<bool>());
}

TEST(Comm, BadArgumentsAreClearErrors) {
  auto& pg = group("mpi");
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    std::string what;
    try {
      f();
    } catch (const mpiddp::Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(text), std::string::npos) << "got: '" << what << "', wanted: " << text;
    return what.find(text) != std::string::npos;
  };
  const uint64_t seq = pg.sequence();
  bool ok = true;
  auto m = torch::ones({4, 6}, torch::kFloat);
  ok &= expect_error([&] { pg.allreduce(m.t()); }, "contiguous");
  ok &= expect_error([&] { pg.allreduce(torch::ones({3}, torch::kBool)); }, "unsupported dtype Bool");
  ok &= expect_error([&] { pg.allreduce(torch::ones({3}, torch::kUInt8)); }, "unsupported dtype");
  ok &= expect_error([&] { pg.allreduce_async(torch::ones({3}), torch::ones({3}, torch::kDouble), ReduceOp::kSum); },
                     "input is float32 but output is float64");
  ok &= expect_error([&] { pg.allreduce_async(torch::ones({3}), torch::ones({4}), ReduceOp::kSum); }, "elements");
  ok &= expect_error([&] { pg.allgather(torch::ones({3}), torch::ones({3 * pg.size() + 1})); }, "world size x input");
  ok &= expect_error([&] { pg.broadcast(torch::ones({3}), pg.size()); }, "outside a world");
  ok &= expect_error(
      [&] { pg.allreduce_async(torch::ones({3}, torch::kInt), torch::ones({3}, torch::kInt), ReduceOp::kAvg); },
      "mpi does not support allreduce of int32 with avg");
  ok &= expect_error([&] { pg.allreduce(torch::empty({3}, torch::TensorOptions().device(torch::kMeta))); },
                     "the mpi backend takes CPU or CUDA tensors, got one on meta");
  EXPECT_EQ(pg.sequence(), seq) << "refused calls must not consume sequence numbers";
  MPIDDP_EXPECT_ALL(ok && pg.sequence() == seq);
}

TEST(Comm, UnknownBackendNamesTheBuiltOnes) {
  std::string what;
  try {
    mpiddp::make_process_group("carrier-pigeon", runtime());
  } catch (const mpiddp::Error& e) {
    what = e.what();
  }
  MPIDDP_EXPECT_ALL(what.find("backend 'carrier-pigeon' is not built") != std::string::npos &&
                    what.find("available: mpi") != std::string::npos);
}

TEST(CheckMode, ShapeMismatchReportedOnEveryRankThenGroupStillWorks) {
  auto& pg = group("mpi");
  const int n = pg.size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const uint64_t seq = pg.sequence() + 1;
  // Rank 1 sends a different shape: without check mode this would hang or corrupt memory.
  auto t = torch::ones({pg.rank() == 1 ? 5 : 4}, torch::kFloat);
  std::string what;
  try {
    pg.allreduce(t);
  } catch (const mpiddp::CollectiveMismatch& e) {
    what = e.message();
  }
  std::string others = n > 2 ? "ranks 0,2" : "rank 0";
  for (int r = 3; r < n; ++r) others += "," + std::to_string(r);
  const std::string want = "collective mismatch at #" + std::to_string(seq) + ": " + others +
                           " issued allreduce(float32[4], sum); rank 1 issued allreduce(float32[5], sum)";
  EXPECT_EQ(what, want);
  MPIDDP_EXPECT_ALL(what == want);
  // Nothing was launched anywhere, so the next collective is consistent again.
  auto u = torch::ones({3}, torch::kFloat);
  pg.allreduce(u);
  MPIDDP_EXPECT_ALL(u.eq(static_cast<float>(n)).all().item<bool>());
}

TEST(CheckMode, DifferentCollectivesAndRootsReported) {
  auto& pg = group("mpi");
  if (pg.size() < 2) GTEST_SKIP() << "needs two ranks";
  auto t = torch::ones({4}, torch::kFloat);
  std::string what;
  try {
    if (pg.rank() == 0) {
      pg.broadcast(t, 0);
    } else {
      pg.allreduce(t);
    }
  } catch (const mpiddp::CollectiveMismatch& e) {
    what = e.message();
  }
  MPIDDP_EXPECT_ALL(what.find("rank 0 issued broadcast(float32[4], root 0)") != std::string::npos &&
                    what.find("issued allreduce(float32[4], sum)") != std::string::npos);
  what.clear();
  try {
    pg.broadcast(t, pg.rank() == 0 ? 1 : 0);
  } catch (const mpiddp::CollectiveMismatch& e) {
    what = e.message();
  }
  MPIDDP_EXPECT_ALL(what.find("rank 0 issued broadcast(float32[4], root 1)") != std::string::npos);
}

TEST(CheckMode, OffStillComputes) {
  mpiddp::CommOptions o;
  o.check_collectives = false;
  auto pg = mpiddp::make_process_group("mpi", runtime(), o);
  auto t = torch::full({1031}, static_cast<double>(pg->rank()), torch::kDouble);
  pg->allreduce(t);
  const int n = pg->size();
  MPIDDP_EXPECT_ALL(t.eq(n * (n - 1) / 2.0).all().item<bool>());
}

TEST(Names, RoundTrip) {
  bool ok = true;
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax};
  const std::vector<c10::ScalarType> dtypes = {c10::kFloat, c10::kDouble, c10::kBFloat16,
                                               c10::kHalf,  c10::kInt,    c10::kLong};
  EXPECT_EQ(mpiddp::detail::reduce_ops(), ops);  // the lists the cases above loop over: every one
  EXPECT_EQ(mpiddp::detail::collective_dtypes(), dtypes);
  for (auto op : ops) ok = ok && mpiddp::parse_reduce_op(mpiddp::to_string(op)) == op;
  for (auto d : dtypes) ok = ok && mpiddp::parse_dtype(mpiddp::dtype_name(d)) == d;
  EXPECT_THROW(mpiddp::parse_reduce_op("prod"), mpiddp::Error);
  EXPECT_THROW(mpiddp::parse_dtype("complex64"), mpiddp::Error);
  MPIDDP_EXPECT_ALL(ok);
}

// The nccl group times its collectives on the GPU (CUDA events around each on its stream); the CPU
// groups say that they do not measure it.
TEST(CommTiming, NcclMeasuresGpuTimeTheOthersSayNone) {
  for (const auto& name : cpu_backends()) MPIDDP_EXPECT_ALL(!group(name).device_seconds().has_value()) << name;
  if (!mpiddp::testing::nccl_built()) GTEST_SKIP() << "nccl is not built";
  if (!nccl_usable()) {
    if (nccl_required()) FAIL() << "MPIDDP_REQUIRE_GPU=1 but the nccl backend is unusable";
    GTEST_SKIP() << "nccl needs one GPU per rank and a CUDA libtorch";
  }
  auto& pg = group("nccl");
  const double before = pg.device_seconds().value_or(-1);
  auto t = torch::ones({1 << 22}, torch::TensorOptions().device(runtime().device()));
  pg.allreduce(t);
  const double after = pg.device_seconds().value_or(-1);
  MPIDDP_EXPECT_ALL(before >= 0 && after > before) << before << " s, then " << after << " s";
}

// wait_on_device() on the nccl group orders the stream, not the host: it returns while the GPU still
// runs what was queued before the collective, the handle then counts as complete, what the device
// reads next sees the sum, and the collective's GPU time is counted once it has run.
TEST(CommTiming, NcclWaitOnDeviceLeavesTheHostFree) {
  if (!mpiddp::testing::nccl_built()) GTEST_SKIP() << "nccl is not built";
  if (!nccl_usable()) {
    if (nccl_required()) FAIL() << "MPIDDP_REQUIRE_GPU=1 but the nccl backend is unusable";
    GTEST_SKIP() << "nccl needs one GPU per rank and a CUDA libtorch";
  }
#if MPIDDP_HAS_NCCL
  auto& pg = group("nccl");
  const auto options = torch::TensorOptions().device(runtime().device());
  torch::cuda::synchronize();
  const double before = pg.device_seconds().value_or(-1);
  auto busy = torch::randn({4096, 4096}, options);
  for (int i = 0; i < 40; ++i) busy = torch::matmul(busy, busy).div_(64);  // ~0.1 s of an H100's float32
  auto t = torch::ones({1 << 20}, options);
  auto work = pg.allreduce_async(t, t, ReduceOp::kSum);
  work->wait_on_device();
  const bool host_went_on = cudaStreamQuery(nullptr) == cudaErrorNotReady;
  EXPECT_TRUE(host_went_on) << "wait_on_device() returned after the device had finished its queue";
  EXPECT_TRUE(work->test());
  const auto sum = t.cpu();  // queued behind the collective
  EXPECT_TRUE(torch::equal(sum, torch::full({1 << 20}, static_cast<float>(pg.size()))));
  torch::cuda::synchronize();
  const double after = pg.device_seconds().value_or(-1);
  EXPECT_GT(after, before);
  MPIDDP_EXPECT_ALL(host_went_on && after > before);
#endif
}
