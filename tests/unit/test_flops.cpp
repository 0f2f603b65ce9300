// Model FLOPs and device peaks (flops.hpp): the built-in GPT's figure against nanoGPT's formula
// worked out here from the module's own parameters; the peak table's every row, and what it must
// not know.
#include <mpiddp/flops.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace {

// nanoGPT's estimate_mfu per sample: (6 N + 12 L C T) T, N from the parameters as nanoGPT's
// get_num_params(non_embedding=True) counts them: each tensor once, less the position embedding.
double nanogpt_flops_per_sample(const mpiddp::Gpt& gpt, int64_t t) {
  double n = 0;
  std::set<const void*> seen;
  for (const auto& p : gpt->named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value().data_ptr()).second) n += static_cast<double>(p.value().numel());
  }
  n -= static_cast<double>(gpt->named_parameters()["transformer.wpe.weight"].numel());
  const auto& c = gpt->config();
  return (6 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * t)) * static_cast<double>(t);
}

}  // namespace

TEST(Flops, GptIsNanoGptsEstimateOfItsOwnParameters) {
  struct Shape {
    int64_t layers, heads, width, block, vocab;
    bool bias;
  };
  for (const auto& s : {Shape{2, 4, 64, 32, 512, true}, Shape{3, 2, 48, 24, 300, false}}) {
    mpiddp::GptConfig c;
    c.n_layer = s.layers;
    c.n_head = s.heads;
    c.n_embd = s.width;
    c.block_size = s.block;
    c.vocab_size = s.vocab;
    c.bias = s.bias;
    mpiddp::Gpt gpt(c);
    const auto model = mpiddp::wrap_module(gpt);
    for (const int64_t t : {s.block, s.block / 2}) {  // the data's block size may be below the model's
      const double want = nanogpt_flops_per_sample(gpt, t);
      EXPECT_DOUBLE_EQ(gpt->training_flops_per_sample(t), want) << "layers " << s.layers << ", T " << t;
      EXPECT_DOUBLE_EQ(model->training_flops_per_sample(t), want) << "through Model, layers " << s.layers;
    }
  }
}

TEST(Flops, ModelsThatDoNotCountTheirFlopsSayZero) {
  const auto model = mpiddp::wrap_module(torch::nn::Linear(4, 2));
  EXPECT_EQ(model->training_flops_per_sample(0), 0);
  EXPECT_EQ(model->training_flops_per_sample(16), 0);
}

TEST(Flops, DensePeaksOfKnownDevices) {
  struct Row {
    const char* name;
    double half, fp32;
  };
  const std::vector<Row> rows = {
      {"NVIDIA H100 80GB HBM3", 989e12, 67e12},   {"NVIDIA H200", 989e12, 67e12},
      {"NVIDIA H100 PCIe", 756e12, 51e12},        {"NVIDIA H100 NVL", 835e12, 60e12},
      {"NVIDIA A100-SXM4-80GB", 312e12, 19.5e12}, {"NVIDIA A100-SXM4-40GB", 312e12, 19.5e12},
      {"NVIDIA A100-PCIE-40GB", 312e12, 19.5e12}, {"NVIDIA A100 80GB PCIe", 312e12, 19.5e12},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(mpiddp::dense_peak_flops(r.name, c10::kBFloat16), r.half) << r.name;
    EXPECT_EQ(mpiddp::dense_peak_flops(r.name, c10::kHalf), r.half) << r.name;
    EXPECT_EQ(mpiddp::dense_peak_flops(r.name, c10::kFloat), r.fp32) << r.name;
    EXPECT_EQ(mpiddp::dense_peak_flops(r.name, c10::kDouble), std::nullopt) << r.name << ": no fp64 figures";
  }
}

TEST(Flops, UnknownDevicesHaveNoPeak) {
  for (const std::string name : {"cpu", "", "NVIDIA GeForce RTX 4090", "NVIDIA H200 NVL", "NVIDIA H100",
                                 "nvidia h100 80gb hbm3", "NVIDIA H100 80GB HBM3 "}) {
    EXPECT_EQ(mpiddp::dense_peak_flops(name, c10::kBFloat16), std::nullopt) << "'" << name << "'";
    EXPECT_EQ(mpiddp::dense_peak_flops(name, c10::kFloat), std::nullopt) << "'" << name << "'";
  }
}
