// The optimizer step alone, on the parameter shapes of the CNN of bench/train_bench.sh (PyTorch's
// MNIST example network, 1.2 M parameters), 1 thread: libtorch's own torch::optim::Adam against
// mpiddp::FusedAdam (one aten::_fused_adam_ call where the linked libtorch has a CPU kernel).
// Rounds alternate the two; prints one JSON line with the median ms per step of each.
//   usage: mpiddp_optim_step [STEPS] [ROUNDS]
#include <mpiddp/compat.hpp>
#include <mpiddp/optim.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

std::vector<torch::Tensor> cnn_params() {
  const std::vector<std::vector<int64_t>> shapes = {{32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64},
                                                    {128, 9216},   {128}, {10, 128},     {10}};
  std::vector<torch::Tensor> out;
  for (const auto& s : shapes) {
    auto p = torch::randn(s).requires_grad_(true);
    p.mutable_grad() = torch::randn(s);
    out.push_back(p);
  }
  return out;
}

double ms_per_step(torch::optim::Optimizer& opt, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) opt.step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  auto a = cnn_params(), b = cnn_params();
  torch::optim::Adam adam(a, torch::optim::AdamOptions(0.002));
  mpiddp::FusedAdam fused(b, torch::optim::AdamOptions(0.002));
  adam.step();  // states created outside the timing
  fused.step();
  std::vector<double> t_adam, t_fused;
  for (int r = 0; r < rounds; ++r) {
    t_adam.push_back(ms_per_step(adam, steps));
    t_fused.push_back(ms_per_step(fused, steps));
  }
  std::printf("{\"torch\": \"%s\", \"params\": 1199882, \"steps\": %d, \"rounds\": %d, \"adam_ms\": %.3f, "
              "\"fused_adam_ms\": %.3f, \"fused_kernel\": %s}\n",
              mpiddp::compat::torch_version(), steps, rounds, median(t_adam), median(t_fused),
              fused.last_step_fused() ? "true" : "false");
  return 0;
}
