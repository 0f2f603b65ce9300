// `mpiddp train`: DDP training of a built-in model on an HDF5 dataset. Options come from the
// command line, then --config FILE, then MPIDDP_* variables (see cli.hpp).
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "app/cli.hpp"

namespace mpiddp::app {

int run_train(Runtime& runtime, const std::vector<std::string>& args) {
  TrainConfig c;
  double bucket_mb = 25, first_bucket_mb = 1, cache_mb = 512;
  std::string compression = "none", timeline;
  po::options_description options("mpiddp train options");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>(), "read options from this file (name = value lines)")(
      "model", po::value(&c.model)->default_value("cnn"), "linear | mlp | cnn (PyTorch's MNIST example net)")(
      "data", po::value(&c.data), "training set (HDF5, see `mpiddp data`)")(
      "test-data", po::value(&c.test_data), "test set, evaluated after each epoch")(
      "epochs", po::value(&c.epochs)->default_value(1), "passes over the training set")(
      "max-steps", po::value(&c.max_steps)->default_value(0), "stop after this many steps in all (0: no cap)")(
      "batch-size", po::value(&c.batch_size)->default_value(64), "samples per rank per step")(
      "lr", po::value(&c.lr)->default_value(0.01), "learning rate")(
      "optimizer", po::value(&c.optimizer)->default_value("sgd"), "sgd | adam | adamw")(
      "momentum", po::value(&c.momentum)->default_value(0.0), "sgd momentum")(
      "weight-decay", po::value(&c.weight_decay)->default_value(0.0), "weight decay")(
      "lr-schedule", po::value(&c.schedule)->default_value("none"), "none | step | cosine")(
      "step-size", po::value(&c.step_size)->default_value(1), "step schedule: epochs between decays")(
      "gamma", po::value(&c.gamma)->default_value(0.1), "step schedule: decay factor")(
      "warmup-steps", po::value(&c.warmup_steps)->default_value(0), "linear warmup over this many steps")(
      "seed", po::value(&c.seed)->default_value(0), "seed of the initial model and the sampler's shuffle")(
      "no-shuffle", "keep the dataset's order")("drop-last", "drop the tail instead of padding shards to equal length")(
      "device", po::value(&c.device)->default_value("cpu"), "cpu | cuda")(
      "backend", po::value(&c.backend)->default_value("mpi"), "mpi | nccl | gloo")(
      "threads", po::value(&c.threads)->default_value(0), "intra-op threads per rank (0: the cores each rank owns)")(
      "metrics", po::value(&c.metrics_path), "append one JSON line per epoch to this file (rank 0)")(
      "cache-mb", po::value(&cache_mb)->default_value(512.0),
      "read a dataset into memory once when it is at most this size (MiB; 0: read every batch from the file)")(
      "bucket-cap-mb", po::value(&bucket_mb)->default_value(25.0), "DDP bucket cap (MiB)")(
      "first-bucket-cap-mb", po::value(&first_bucket_mb)->default_value(1.0), "DDP first bucket cap (MiB)")(
      "compression", po::value(&compression)->default_value("none"), "gradients on the wire: none | bf16 | fp16")(
      "timeline", po::value(&timeline), "per-rank Chrome trace of DDP (FILE -> FILE.rank<r>.json)")(
      "snapshot-dir", po::value(&c.snapshot_dir), "write snapshots here (rank 0; HDF5, latest.h5 names the newest)")(
      "save-every", po::value(&c.save_every)->default_value(1), "snapshot every N epochs (0: only at the end)")(
      "save-every-steps", po::value(&c.save_every_steps)->default_value(0), "also snapshot every N steps (0: off)")(
      "keep", po::value(&c.keep)->default_value(3), "snapshots kept in --snapshot-dir (0: all)")(
      "resume", po::value(&c.resume)->default_value("auto"),
      "auto (newest valid snapshot in --snapshot-dir, if any) | never | a snapshot file")(
      "on-nan", po::value(&c.on_nan)->default_value("stop"),
      "NaN/Inf loss: stop (an error naming the step) | skip (drop that step's update)");

  std::unique_ptr<Trainer> trainer;
  po::variables_map vm;
  auto local = [&] {
    vm = parse_options(options, args);
    if (vm.count("help")) return;
    c.shuffle = vm.count("no-shuffle") == 0;
    c.drop_last = vm.count("drop-last") > 0;
    MPIDDP_CHECK(bucket_mb > 0 && first_bucket_mb > 0, "--bucket-cap-mb and --first-bucket-cap-mb must be > 0");
    c.ddp.bucket_cap_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
    c.ddp.first_bucket_cap_bytes = static_cast<int64_t>(first_bucket_mb * (1 << 20));
    MPIDDP_CHECK(compression == "none" || compression == "bf16" || compression == "fp16",
                 "unknown --compression '" + compression + "' (none, bf16, fp16)");
    if (compression == "bf16") c.ddp.compression = c10::kBFloat16;
    if (compression == "fp16") c.ddp.compression = c10::kHalf;
    c.ddp.timeline_path = timeline;
    MPIDDP_CHECK(cache_mb >= 0, "--cache-mb must be >= 0");
    c.cache_bytes = static_cast<int64_t>(cache_mb * (1 << 20));
    trainer = std::make_unique<Trainer>(runtime, c);  // opens and checks the data on every rank
  };
  if (auto code = agree_on_local_phase(runtime, "train", local)) return *code;
  if (vm.count("help")) {
    print_help(runtime,
               "usage: mpirun -np N mpiddp train --data TRAIN.h5 [--test-data TEST.h5] [options]\n\n"
            "Options are read from the command line, then --config FILE, then MPIDDP_<NAME> variables\n"
            "(--batch-size <- MPIDDP_BATCH_SIZE); the first that sets one wins.\n\n",
               options);
    return kExitOk;
  }
  if (runtime.rank() == 0) {
    const auto& info = trainer->model();
    int64_t params = 0;
    for (const auto& p : info->parameters()) params += p.numel();
    std::printf("mpiddp train: model %s (%lld parameters), %d rank(s) x batch %lld, %d thread(s) per rank, backend %s, device %s\n",
                c.model.c_str(), static_cast<long long>(params), runtime.size(), static_cast<long long>(c.batch_size),
                trainer->threads(), c.backend.c_str(), c.device.c_str());
    std::fflush(stdout);
  }
  const auto result = trainer->fit([&](const EpochMetrics& m, const std::vector<std::string>& lines) {
    if (runtime.rank() != 0) return;
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    std::printf("epoch %lld: train loss %.4f", static_cast<long long>(m.epoch), m.train_loss);
    if (m.test_loss >= 0) std::printf(", test loss %.4f", m.test_loss);
    if (m.test_accuracy >= 0) std::printf(", test accuracy %.2f%%", 100.0 * m.test_accuracy);
    std::printf(", %.1f samples/s, %.1f s, lr %.3g", m.samples_per_s, m.seconds, m.lr);
    if (m.skipped_steps > 0) std::printf(", %lld step(s) skipped (NaN/Inf loss)", static_cast<long long>(m.skipped_steps));
    std::printf("\n");
    std::fflush(stdout);
  }, [](const std::string& note) {
    std::printf("%s\n", note.c_str());
    std::fflush(stdout);
  });
  if (runtime.rank() == 0 && result.stop_signal == 0 && !result.last_snapshot.empty()) {
    std::printf("final snapshot: %s (global step %lld)\n", result.last_snapshot.c_str(),
                static_cast<long long>(result.global_step));
  }
  return kExitOk;
}

}  // namespace mpiddp::app
