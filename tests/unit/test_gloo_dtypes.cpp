// mpiddp's gloo backend says which dtypes it takes from what the linked gloo was built with
// (cmake/TorchFeatures.cmake, compat.hpp). The independent reference: c10d's ProcessGroupGloo
// itself, called directly on a one-rank group over an in-memory store, for every float dtype and
// collective that mpiddp routes through it. What mpiddp refuses must fail there, and what it
// takes must work there; so a gate that goes stale on a new libtorch or gloo fails this test.
#include <gtest/gtest.h>
#include <mpiddp/compat.hpp>
#include <mpiddp/config.hpp>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace {

c10::intrusive_ptr<c10d::ProcessGroupGloo> one_rank_gloo() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(10000));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
}

// Whether c10d's Gloo runs an allreduce, a broadcast and an allgather of `dtype` to completion.
bool gloo_takes(c10d::ProcessGroupGloo& pg, c10::ScalarType dtype) {
  try {
    std::vector<at::Tensor> v = {torch::ones({5}, dtype)};
    pg.allreduce(v)->wait();
    pg.broadcast(v)->wait();
    std::vector<std::vector<at::Tensor>> out = {{torch::zeros({5}, dtype)}};
    pg.allgather(out, v)->wait();
    return out[0][0].to(torch::kDouble).sum().item<double>() == 5.0;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST(GlooDtypes, GateMatchesTheLinkedGloo) {
  auto pg = one_rank_gloo();
  EXPECT_TRUE(gloo_takes(*pg, c10::kFloat));
  EXPECT_TRUE(gloo_takes(*pg, c10::kDouble));
  EXPECT_EQ(gloo_takes(*pg, c10::kHalf), static_cast<bool>(MPIDDP_GLOO_HAS_HALF))
      << "float16: mpiddp's gate says " << MPIDDP_GLOO_HAS_HALF;
  EXPECT_EQ(gloo_takes(*pg, c10::kBFloat16), static_cast<bool>(MPIDDP_GLOO_HAS_BFLOAT16))
      << "bfloat16: mpiddp's gate says " << MPIDDP_GLOO_HAS_BFLOAT16;
}
