// The baseline a user writes without a framework: libtorch + MPI by hand. The whole HDF5 dataset
// is read into memory with plain HDF5 calls, rank 0's initial parameters are broadcast, and after
// each backward all gradients are packed into one buffer, summed by one blocking MPI_Allreduce,
// divided by the world size and unpacked. Same models, sampler rule and optimizers as
// `mpiddp train`; one JSON line per epoch on rank 0 (the fields bench/train_bench.sh reads).
// usage: mpiddp_handwritten_ddp --data F.h5 --model linear|cnn --epochs E --batch-size B --lr LR
//        --optimizer sgd|adam [--seed S] [--threads T]
#include <hdf5.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Reads a whole HDF5 dataset into a tensor of `dtype` (HDF5 converts from the stored type).
torch::Tensor read_all(hid_t file, const char* name, c10::ScalarType dtype, hid_t mem_type) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  hid_t space = H5Dget_space(d);
  hsize_t dims[8];
  const int nd = H5Sget_simple_extent_dims(space, dims, nullptr);
  auto t = torch::empty(std::vector<int64_t>(dims, dims + nd), dtype);
  H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr());
  H5Sclose(space);
  H5Dclose(d);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::map<std::string, std::string> a = {{"--model", "linear"}, {"--epochs", "1"},     {"--batch-size", "32"},
                                          {"--lr", "0.001"},     {"--optimizer", "sgd"}, {"--seed", "0"},
                                          {"--threads", "1"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  torch::set_num_threads(std::stoi(a["--threads"]));
  const int64_t epochs = std::stoll(a["--epochs"]), batch = std::stoll(a["--batch-size"]);
  const uint64_t seed = std::stoull(a["--seed"]);

  hid_t file = H5Fopen(a["--data"].c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    std::fprintf(stderr, "cannot open %s\n", a["--data"].c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const bool classes = a["--model"] == "cnn";
  auto inputs = read_all(file, "inputs", torch::kFloat, H5T_NATIVE_FLOAT);
  auto targets = classes ? read_all(file, "targets", torch::kLong, H5T_NATIVE_INT64)
                         : read_all(file, "targets", torch::kFloat, H5T_NATIVE_FLOAT);
  if (classes) inputs.div_(255.0);  // Fashion-MNIST bytes, scaled as mpiddp's files say (1/255)
  H5Fclose(file);

  namespace nn = torch::nn;
  torch::manual_seed(seed);
  nn::Sequential model = classes ? nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3)), nn::ReLU(),
                                                  nn::Conv2d(nn::Conv2dOptions(32, 64, 3)), nn::ReLU(),
                                                  nn::MaxPool2d(2), nn::Dropout(0.25), nn::Flatten(),
                                                  nn::Linear(9216, 128), nn::ReLU(), nn::Dropout(0.5),
                                                  nn::Linear(128, 10))
                                 : nn::Sequential(nn::Flatten(), nn::Linear(inputs.size(1), targets.size(1)));
  auto params = model->parameters();
  for (auto& p : params) MPI_Bcast(p.data_ptr(), static_cast<int>(p.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  const double lr = std::stod(a["--lr"]);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (a["--optimizer"] == "adam") {
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
  } else {
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
  }
  int64_t numel = 0;
  for (auto& p : params) numel += p.numel();
  auto flat = torch::empty({numel});

  // PyTorch's DistributedSampler: a permutation seeded by seed + epoch, padded, rank-strided.
  const int64_t n = inputs.size(0), per_rank = (n + size - 1) / size, steps = per_rank / batch;
  double first_step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto gen = at::detail::createCPUGenerator(seed + static_cast<uint64_t>(epoch));
    auto perm = torch::randperm(n, gen, torch::kLong);
    perm = torch::cat({perm, perm.slice(0, 0, per_rank * size - n)}).slice(0, rank, per_rank * size, size);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; ++s) {
      auto idx = perm.slice(0, s * batch, (s + 1) * batch);
      auto out = model->forward(inputs.index_select(0, idx));
      auto y = targets.index_select(0, idx);
      auto loss = classes ? torch::nn::functional::cross_entropy(out, y) : torch::mse_loss(out, y);
      opt->zero_grad();
      loss.backward();
      int64_t at = 0;
      for (auto& p : params) flat.slice(0, at, at + p.numel()).copy_(p.grad().view(-1)), at += p.numel();
      MPI_Allreduce(MPI_IN_PLACE, flat.data_ptr(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      flat.div_(size);
      at = 0;
      for (auto& p : params) p.grad().view(-1).copy_(flat.slice(0, at, at + p.numel())), at += p.numel();
      opt->step();
      if (epoch == 0 && s == 0) first_step = unix_seconds();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0) {
      std::printf("{\"epoch\": %lld, \"steps\": %lld, \"seconds\": %.6f, \"samples_per_s\": %.3f",
                  static_cast<long long>(epoch + 1), static_cast<long long>(steps), seconds,
                  static_cast<double>(steps * batch * size) / seconds);
      if (epoch == 0) std::printf(", \"first_step_unix_s\": %.6f", first_step);
      std::printf("}\n");
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
