// Mixed precision: the Autocast guard (this process) and the float16 GradScaler, whose verdict on
// Inf/NaN gradients must be the same on every rank. The scaler's numbers are checked against the
// algorithm's definition (torch.amp.GradScaler's): unscaled gradients are the scaled ones / scale,
// the scale x growth_factor after growth_interval good steps, x backoff_factor on a bad one.
#include <mpiddp/precision.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>

#include "mpi_test.hpp"

using mpiddp::testing::runtime;

namespace {

mpiddp::ProcessGroup& group() { return mpiddp::testing::checked_group("mpi"); }

// The scaler on CPU, or why this libtorch has none (1.x: no CPU kernels for the _amp_ operations).
std::optional<mpiddp::GradScaler> cpu_scaler(mpiddp::GradScalerOptions o, std::string* why) {
  try {
    return mpiddp::GradScaler(c10::kCPU, o);
  } catch (const mpiddp::Error& e) {
    *why = e.message();
    return std::nullopt;
  }
}

}  // namespace

TEST(Precision, AutocastGuardCastsAndRestores) {
  const auto a = torch::randn({4, 8}), b = torch::randn({8, 3});
  {
    mpiddp::Autocast fp32(c10::kCPU, c10::kFloat);  // does nothing
    EXPECT_EQ(torch::mm(a, b).scalar_type(), c10::kFloat);
  }
  {
    mpiddp::Autocast bf16(c10::kCPU, c10::kBFloat16);
    const auto c = torch::mm(a, b);
    EXPECT_EQ(c.scalar_type(), c10::kBFloat16);
    // The product of the bfloat16-rounded operands, as autocast defines it.
    const auto want = torch::mm(a.to(c10::kBFloat16), b.to(c10::kBFloat16));
    EXPECT_TRUE(torch::equal(c, want));
    {
      mpiddp::Autocast nested(c10::kCPU, c10::kBFloat16);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), c10::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), c10::kBFloat16) << "the nested guard switched autocast off";
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), c10::kFloat) << "autocast left on after the guard";
  // Gradients of float32 parameters stay float32 under autocast.
  auto w = torch::randn({8, 3}, torch::requires_grad());
  {
    mpiddp::Autocast bf16(c10::kCPU, c10::kBFloat16);
    torch::mm(a, w).to(c10::kFloat).sum().backward();
  }
  EXPECT_EQ(w.grad().scalar_type(), c10::kFloat);
}

TEST(Precision, Names) {
  EXPECT_EQ(mpiddp::parse_precision("bf16"), c10::kBFloat16);
  EXPECT_EQ(mpiddp::parse_precision("fp16"), c10::kHalf);
  EXPECT_EQ(mpiddp::precision_name(mpiddp::parse_precision("fp32")), "fp32");
  EXPECT_THROW(mpiddp::parse_precision("fp8"), mpiddp::Error);
  EXPECT_THROW(mpiddp::GradScaler(c10::kCPU, mpiddp::GradScalerOptions{0.0}), mpiddp::Error);
  // The check the Trainer makes before it makes a scaler: the constructor's own.
  EXPECT_THROW(mpiddp::check_grad_scaler(c10::kCPU, mpiddp::GradScalerOptions{1.0, 1.0}), mpiddp::Error);
}

TEST(Precision, GradScalerFollowsItsDefinitionAndAgreesAcrossRanks) {
  mpiddp::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  std::string why;
  auto scaler = cpu_scaler(o, &why);
  if (!scaler) GTEST_SKIP() << why;  // the same libtorch on every rank: every rank skips
  auto& pg = group();
  const int last = pg.size() - 1;
  auto p = torch::zeros({5}, torch::requires_grad());
  const auto loss = (p * torch::arange(1, 6, torch::kFloat)).sum();
  EXPECT_EQ(scaler->scale(loss).item<float>(), 1024.0f * loss.item<float>());
  double scale = 1024;
  int good = 0;
  bool ok = true;
  for (int step = 0; step < 8; ++step) {
    // Step 4: one rank's gradient holds an Inf (step 6: a NaN), the others' are finite.
    const bool bad_here = (step == 4 || step == 6) && pg.rank() == last;
    auto g = torch::arange(1, 6, torch::kFloat) * static_cast<float>(scale);
    if (bad_here) g[2] = step == 4 ? std::numeric_limits<float>::infinity() : std::nanf("");
    p.mutable_grad() = g;
    const bool overflow = scaler->unscale({p}, &pg);
    const bool want = step == 4 || step == 6;
    ok = ok && overflow == want;
    if (!want) ok = ok && torch::equal(p.grad(), torch::arange(1, 6, torch::kFloat));  // exact: powers of 2
    scaler->update();
    if (want) {
      scale *= o.backoff_factor;
      good = 0;
    } else if (++good == o.growth_interval) {
      scale *= o.growth_factor;
      good = 0;
    }
    ok = ok && scaler->scale_value() == scale && scaler->growth_tracker() == good;
  }
  MPIDDP_EXPECT_ALL(ok);
  // 1024 -> 2048 (3 good) -> 1024 (Inf) -> 2048? no: 1 good, then NaN -> 512, then 1 good.
  EXPECT_EQ(scaler->scale_value(), 512.0);
  scaler->load(4096, 2);
  EXPECT_EQ(scaler->scale_value(), 4096.0);
  EXPECT_EQ(scaler->growth_tracker(), 2);
}
