// A ResNet-style model of the user's own (residual blocks with BatchNorm) trained with the library
// Trainer: DDP, snapshots every epoch and exact resume, stop signals, evaluation, metrics.
// usage: mpirun -np N resnet_trainer TRAIN.h5 TEST.h5 EPOCHS SNAPSHOT_DIR   (inputs [1, H, W], classes)
#include <mpiddp/runtime.hpp>
#include <mpiddp/trainer.hpp>

#include <iostream>

namespace nn = torch::nn;

struct BlockImpl : nn::Module {
  explicit BlockImpl(int64_t c)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(c))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(c))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(x + bn2(conv2(torch::relu(bn1(conv1(x))))));  // the residual connection
  }
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
};
TORCH_MODULE(Block);

struct ResNetImpl : nn::Module {
  explicit ResNetImpl(int64_t classes, int64_t c = 16)
      : stem(register_module("stem", nn::Conv2d(nn::Conv2dOptions(1, c, 3).padding(1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(c))), block1(register_module("block1", Block(c))),
        block2(register_module("block2", Block(c))), fc(register_module("fc", nn::Linear(c, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = block2(block1(torch::relu(bn(stem(x)))));
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
  nn::Conv2d stem;
  nn::BatchNorm2d bn;
  Block block1, block2;
  nn::Linear fc;
};
TORCH_MODULE(ResNet);

int main(int argc, char** argv) {
  mpiddp::Runtime rt(&argc, &argv);  // MPI alone: rank, size, node, device
  if (argc != 5) {
    if (rt.rank() == 0) std::cerr << "usage: resnet_trainer TRAIN.h5 TEST.h5 EPOCHS SNAPSHOT_DIR" << std::endl;
    return 2;
  }
  auto pg = mpiddp::make_process_group("mpi", rt);
  torch::manual_seed(0);  // seeds and threads are the program's, not the Trainer's
  torch::set_num_threads(mpiddp::fair_share_of_cores(rt.local_size()));  // the node's cores, shared by its ranks
  auto model = mpiddp::wrap_module(ResNet(mpiddp::H5Dataset(argv[1]).info().num_classes), "resnet");
  // Any torch::optim optimizer: its state goes into the snapshots.
  auto opt = std::make_shared<torch::optim::RMSprop>(mpiddp::parameters(*model), torch::optim::RMSpropOptions(1e-3));
  mpiddp::TrainerOptions o;
  o.data = argv[1];
  o.test_data = argv[2];
  o.epochs = std::stoll(argv[3]);
  o.batch_size = 16;
  o.snapshot_dir = argv[4];  // resumes from its newest snapshot when there is one
  o.lr_schedule = mpiddp::step_lr(/*step_size=*/2, /*gamma=*/0.5);  // x0.5 every 2 epochs
  mpiddp::Trainer trainer(rt, *pg, model, opt, o);
  trainer.fit([&](const mpiddp::EpochMetrics& m, const std::vector<std::string>&) {
    if (rt.rank() == 0) std::cout << "epoch " << m.epoch << " loss " << m.train_loss << " accuracy " << m.test_accuracy << std::endl;
  });
  return 0;
}
