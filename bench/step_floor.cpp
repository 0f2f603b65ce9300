// The floor under the toy's training step: the seeds' toy step (Linear(20, 1), batch 32, MSE,
// SGD 1e-3) in libtorch alone, one process, one thread, no MPI, no sampler, no checks: slice the
// batch, forward, loss, loss.item(), backward, step, zero_grad. What any framework's step on
// this machine costs at the least; bench/toy_floor.sh sets mpiddp's step beside it.
//   usage: mpiddp_step_floor [STEPS]   prints {"us_per_step": ...}
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30000;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const auto x = torch::rand({2048, 20}), y = torch::rand({2048, 1});
  torch::nn::Linear fc(20, 1);
  torch::optim::SGD opt(fc->parameters(), torch::optim::SGDOptions(1e-3));
  double sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    const int64_t row = (s % 64) * 32;
    auto loss = torch::mse_loss(fc(x.narrow(0, row, 32)), y.narrow(0, row, 32));
    sum += loss.item<double>();
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"us_per_step\": %.2f, \"steps\": %d, \"loss_sum\": %.6g}\n", 1e6 * seconds / steps, steps, sum);
  return 0;
}
