// `mpiddp data`: writes dataset files in mpiddp's HDF5 layout (see include/mpiddp/data.hpp).
//   mpiddp data fashion-mnist [--source DIR] --out FILE.h5   (also `mnist`: the same IDX format)
//   mpiddp data synthetic --samples 2048 --features 20 --seed S --out FILE.h5
//   mpiddp data text --in FILE... --out PREFIX [--val-fraction F]   (llm.c token shards, bytes)
// Rank 0 does the work; under mpirun every rank agrees on the outcome.
#include <mpiddp/data.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/tokens.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "app/cli.hpp"
#include "app/option_table.hpp"

namespace mpiddp::app {
namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// FILE.h5 -> FILE-train.h5 and FILE-test.h5
std::string split_path(const std::string& out, const std::string& part) {
  std::string base = out;
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".h5") == 0) base.resize(base.size() - 3);
  return base + "-" + part + ".h5";
}

std::string describe(const std::string& path) {
  H5Dataset d(path);
  const auto& i = d.info();
  std::ostringstream s;
  s << "wrote " << path << ": " << i.samples << " samples of [";
  for (size_t k = 0; k < i.sample_shape.size(); ++k) s << (k ? ", " : "") << i.sample_shape[k];
  s << "] " << (i.uint8_inputs ? "uint8" : "float32");
  if (i.classification) {
    s << ", " << i.num_classes << " classes";
  } else {
    s << ", regression targets of " << i.target_dim;
  }
  return s.str() + "\n";
}

std::string convert_idx(const std::string& source, const std::string& out, const std::string& name) {
  std::string report;
  for (const auto& [part, prefix] : {std::pair<std::string, std::string>{"train", "train"}, {"test", "t10k"}}) {
    auto images = read_idx(source + "/" + prefix + "-images-idx3-ubyte.gz");
    auto labels = read_idx(source + "/" + prefix + "-labels-idx1-ubyte.gz");
    MPIDDP_CHECK(images.dim() == 3 && labels.dim() == 1 && images.size(0) == labels.size(0),
                 name + " " + part + ": images " + std::to_string(images.size(0)) + " and labels " +
                     std::to_string(labels.size(0)) + " differ or have the wrong shape");
    const std::string path = split_path(out, part);
    write_dataset(path, images.unsqueeze(1), labels.to(torch::kLong), 1.0 / 255.0, 10,
                  name + " " + part + " from " + source);
    report += describe(path);
  }
  return report;
}

// Tokens per train shard, as llm.c's fineweb.py writes them.
constexpr size_t kShardTokens = 100'000'000;

std::string shard_name(const std::string& prefix, const char* split, int index) {
  char number[16];
  std::snprintf(number, sizeof number, "%06d", index);
  return prefix + "_" + split + "_" + number + ".bin";
}

// Byte-level tokens (vocabulary 256) of the files, in order: the last `val_fraction` of them are
// the validation shard (PREFIX_val_000000.bin), the rest the training shards from
// PREFIX_train_000001.bin on, as llm.c names them (nanoGPT's shakespeare_char splits the same way).
std::string write_text_shards(const std::vector<std::string>& inputs, const std::string& prefix, double val_fraction) {
  std::vector<uint32_t> tokens;
  for (const auto& in : inputs) {
    std::ifstream f(in, std::ios::binary);
    MPIDDP_CHECK(f.good(), "cannot read --in file '" + in + "'");
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    tokens.insert(tokens.end(), bytes.begin(), bytes.end());
  }
  MPIDDP_CHECK(tokens.size() >= 2,
               "the --in files hold " + std::to_string(tokens.size()) + " bytes: too few to train on");
  const auto val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const size_t train = tokens.size() - val;
  MPIDDP_CHECK(train >= 2 && (val_fraction == 0 || val >= 2),
               "--val-fraction " + std::to_string(val_fraction) + " of " + std::to_string(tokens.size()) +
                   " bytes leaves too few for the training or the validation shard");
  std::string report;
  int index = 1;
  for (size_t begin = 0; begin < train; begin += kShardTokens, ++index) {
    const size_t end = std::min(train, begin + kShardTokens);
    const std::string path = shard_name(prefix, "train", index);
    write_token_shard(path, std::vector<uint32_t>(tokens.begin() + begin, tokens.begin() + end));
    report += "wrote " + path + ": " + std::to_string(end - begin) + " tokens (bytes, vocabulary 256)\n";
  }
  if (val > 0) {
    const std::string path = shard_name(prefix, "val", 0);
    write_token_shard(path, std::vector<uint32_t>(tokens.begin() + train, tokens.end()));
    report += "wrote " + path + ": " + std::to_string(val) + " tokens (bytes, vocabulary 256)\n";
  }
  return report;
}

// What the command line says; its initial values are the options' defaults.
struct DataConfig {
  std::string kind, source, out;
  int64_t samples = 2048, features = 20, targets = 1;
  uint64_t seed = 0;
  std::vector<std::string> inputs;
  double val_fraction = 0.1;
};

// Every `mpiddp data` option, once.
const std::vector<OptionRow<DataConfig>>& data_options() {
  using C = DataConfig;
  static const std::vector<OptionRow<C>> rows = {
      option<C>(
          "kind", [](C & c) -> auto& { return c.kind; }, "fashion-mnist | mnist | synthetic | text", kNoDefault)
          .positional(),
      option<C>(
          "source", [](C & c) -> auto& { return c.source; },
          "folder of the IDX .gz files (fashion-mnist default: " + std::string(kFashionMnistDir) + ")", kNoDefault),
      option<C>(
          "out", [](C & c) -> auto& { return c.out; },
          "output file; fashion-mnist/mnist write OUT-train.h5 and OUT-test.h5", kNoDefault),
      option<C>(
          "samples", [](C & c) -> auto& { return c.samples; }, "synthetic: samples"),
      option<C>(
          "features", [](C & c) -> auto& { return c.features; }, "synthetic: inputs per sample"),
      option<C>(
          "targets", [](C & c) -> auto& { return c.targets; }, "synthetic: regression targets per sample"),
      option<C>(
          "seed", [](C & c) -> auto& { return c.seed; }, "synthetic: random seed (same seed, same file)"),
      option<C>(
          "in", [](C & c) -> auto& { return c.inputs; }, "text: the text files, read as bytes in this order",
          kNoDefault)
          .multitoken(),
      option<C>(
          "val-fraction", [](C & c) -> auto& { return c.val_fraction; },
          "text: the last fraction of the bytes that goes to the validation shard (0: none)"),
  };
  return rows;
}

}  // namespace

int run_data(Runtime& runtime, const std::vector<std::string>& args) {
  DataConfig c;
  const auto options = describe("mpiddp data options", data_options(), c);
  const auto positional = positionals(data_options());
  return run_rank0_command(
      runtime, args,
      {"data",
       "usage: mpiddp data fashion-mnist|mnist [--source DIR] --out FILE.h5\n"
       "       mpiddp data synthetic [--samples N] [--features F] [--seed S] --out FILE.h5\n"
       "       mpiddp data text --in FILE... --out PREFIX [--val-fraction F]\n\n"
       "Writes datasets in mpiddp's HDF5 layout: /inputs [N, ...] (uint8 with a scale attribute, or\n"
       "float32), /targets [N] int64 classes or [N, k] float32, file attributes task and num_classes.\n"
       "synthetic is the seeds' regression set: inputs and targets uniform in [0, 1).\n"
       "text writes llm.c token shards of the files' bytes (vocabulary 256): PREFIX_train_000001.bin, ...\n"
       "(at most 100M tokens each) and PREFIX_val_000000.bin, the last --val-fraction of the bytes.\n\n",
       options, &positional,
       [&](const po::variables_map&) {
         MPIDDP_CHECK(c.kind == "fashion-mnist" || c.kind == "mnist" || c.kind == "synthetic" || c.kind == "text",
                      c.kind.empty() ? std::string("say what to write: fashion-mnist, mnist, synthetic or text")
                                     : "unknown dataset kind '" + c.kind + "' (fashion-mnist, mnist, synthetic, text)");
         MPIDDP_CHECK(!c.out.empty(), "--out is required");
         if (c.kind == "text") {
           MPIDDP_CHECK(!c.inputs.empty(), "text: --in FILE... is required");
           for (const auto& in : c.inputs) {
             MPIDDP_CHECK(std::filesystem::is_regular_file(in), "--in '" + in + "' is not a readable file");
           }
           MPIDDP_CHECK(c.val_fraction >= 0 && c.val_fraction < 1,
                        "--val-fraction must be in [0, 1), got " + std::to_string(c.val_fraction));
           return;
         }
         if (c.kind == "fashion-mnist" && c.source.empty()) c.source = kFashionMnistDir;
         MPIDDP_CHECK(c.kind == "synthetic" || !c.source.empty(), "--source is required for " + c.kind);
         MPIDDP_CHECK(c.kind == "synthetic" || std::filesystem::is_directory(c.source),
                      "--source '" + c.source + "' is not a folder");
         MPIDDP_CHECK(c.samples > 0 && c.features > 0 && c.targets > 0,
                      "--samples, --features and --targets must be > 0");
       },
       [&] {
         if (c.kind == "text") return write_text_shards(c.inputs, c.out, c.val_fraction);
         if (c.kind == "synthetic") {
           torch::manual_seed(c.seed);
           auto x = torch::rand({c.samples, c.features});
           auto y = torch::rand({c.samples, c.targets});
           write_dataset(c.out, x, y, 1.0, 0, "mpiddp data synthetic --seed " + std::to_string(c.seed));
           return describe(c.out);
         }
         return convert_idx(c.source, c.out, c.kind);
       }});
}

}  // namespace mpiddp::app
