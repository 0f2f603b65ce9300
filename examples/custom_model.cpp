// Trains a user-defined module with mpiddp's library API alone (no CLI): runtime, dataset,
// sampler, DDP. usage: mpirun -np N custom_model DATA.h5   (regression data: mpiddp data synthetic)
#include <mpiddp/data.hpp>
#include <mpiddp/ddp.hpp>
#include <mpiddp/runtime.hpp>

#include <torch/torch.h>

#include <iostream>

struct TwoLayerImpl : torch::nn::Module {
  explicit TwoLayerImpl(int64_t in) : fc1(register_module("fc1", torch::nn::Linear(in, 32))),
                                      fc2(register_module("fc2", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

int main(int argc, char** argv) {
  mpiddp::Runtime rt(&argc, &argv);  // MPI alone: rank, size, node, device
  if (argc != 2) {
    if (rt.rank() == 0) std::cerr << "usage: custom_model DATA.h5" << std::endl;
    return 2;
  }
  torch::set_num_threads(mpiddp::fair_share_of_cores(rt.local_size()));  // the node's cores, shared by its ranks
  mpiddp::H5Dataset data(argv[1]);
  auto pg = mpiddp::make_process_group("mpi", rt);
  TwoLayer model(data.info().sample_shape.at(0));
  mpiddp::DistributedDataParallel ddp(model.ptr(), *pg);  // same weights everywhere from here
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  mpiddp::DistributedSampler sampler(data.size(), rt.rank(), rt.size(), /*shuffle=*/true, /*seed=*/1);
  const int64_t batch = 32;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    const auto idx = sampler.indices();
    double total = 0;
    const int64_t steps = sampler.num_samples() / batch;
    for (int64_t s = 0; s < steps; ++s) {
      auto e = data.read({idx.begin() + s * batch, idx.begin() + (s + 1) * batch});
      opt.zero_grad();
      auto loss = torch::mse_loss(model->forward(e.inputs), e.targets);
      loss.backward();  // returns with the gradients averaged over all ranks
      opt.step();
      total += loss.item<double>();
    }
    auto mean = torch::tensor({total / static_cast<double>(steps)}, torch::kDouble);
    pg->allreduce(mean, mpiddp::ReduceOp::kAvg);
    if (rt.rank() == 0) std::cout << "epoch " << epoch << " mse " << mean.item<double>() << std::endl;
  }
  return 0;
}
