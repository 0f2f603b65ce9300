// The built-in GPT <-> Hugging Face's GPT-2 (see hf_gpt2.hpp).
#include "models/hf_gpt2.hpp"

#include <mpiddp/error.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/text.hpp"
#include "io/safetensors.hpp"

namespace mpiddp {

namespace {

using detail::ends_with;
using detail::shape_text;
using nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kPrefix = "transformer.";
constexpr const char* kHead = "lm_head.weight";
constexpr const char* kTokenEmbedding = "transformer.wte.weight";
constexpr double kLayerNormEpsilon = 1e-5;  // the built-in GPT's, fixed
constexpr int64_t kGpt2EndOfText = 50256;   // GPT-2's <|endoftext|>, its bos and eos

// One tensor of GPT-2: its name (ours and Hugging Face's alike), its shape in our GPT, whether it
// is a Conv1D weight (stored transposed there), whether it is a bias (a GPT without biases has none).
struct Gpt2Tensor {
  std::string name;
  std::vector<int64_t> shape;
  bool conv1d = false;
  bool bias = false;
};

// The one rule: every tensor GPT2LMHeadModel's file holds, in GPT-2's order.
std::vector<Gpt2Tensor> gpt2_tensors(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<Gpt2Tensor> out = {{"transformer.wte.weight", {c.vocab_size, C}},
                                 {"transformer.wpe.weight", {c.block_size, C}}};
  const auto layer_norm = [&](const std::string& name) {
    out.push_back({name + ".weight", {C}});
    out.push_back({name + ".bias", {C}, false, true});
  };
  const auto conv1d = [&](const std::string& name, int64_t in, int64_t outputs) {
    out.push_back({name + ".weight", {outputs, in}, true});
    out.push_back({name + ".bias", {outputs}, false, true});
  };
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string block = "transformer.h." + std::to_string(i) + ".";
    layer_norm(block + "ln_1");
    conv1d(block + "attn.c_attn", C, 3 * C);
    conv1d(block + "attn.c_proj", C, C);
    layer_norm(block + "ln_2");
    conv1d(block + "mlp.c_fc", C, 4 * C);
    conv1d(block + "mlp.c_proj", 4 * C, C);
  }
  layer_norm("transformer.ln_f");
  return out;
}

std::vector<int64_t> hf_shape(const Gpt2Tensor& t) {
  return t.conv1d ? std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()) : t.shape;
}

// transformers' activation_function (an ACT2FN name) as GptConfig::activation, whose two names
// ("gelu": exact, "gelu_new") are ACT2FN's own for the same functions.
std::string activation_from_hf(const std::string& theirs, const std::string& source) {
  if (theirs == "gelu") return "gelu";
  // NewGELU is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): torch's gelu(x, "tanh"), which
  // transformers calls gelu_pytorch_tanh.
  if (theirs == "gelu_new" || theirs == "gelu_pytorch_tanh") return "gelu_new";
  MPIDDP_THROW(source + ": activation_function '" + theirs +
               "' is not one the built-in GPT has (gelu, gelu_new, gelu_pytorch_tanh)");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  MPIDDP_CHECK(in.good() || in.eof(), "cannot read '" + path + "'");
  return text.str();
}

}  // namespace

std::string hf_gpt2_config_json(const GptConfig& c) {
  auto j = nlohmann::ordered_json{{"architectures", {"GPT2LMHeadModel"}},
                                  {"model_type", "gpt2"},
                                  {"vocab_size", c.vocab_size},
                                  {"n_positions", c.block_size},
                                  {"n_embd", c.n_embd},
                                  {"n_layer", c.n_layer},
                                  {"n_head", c.n_head},
                                  {"n_inner", nullptr},
                                  {"activation_function", c.activation},
                                  {"resid_pdrop", c.dropout},
                                  {"embd_pdrop", c.dropout},
                                  {"attn_pdrop", c.dropout},
                                  {"layer_norm_epsilon", kLayerNormEpsilon},
                                  {"initializer_range", 0.02},
                                  {"scale_attn_weights", true},
                                  {"scale_attn_by_inverse_layer_idx", false},
                                  {"reorder_and_upcast_attn", false},
                                  {"use_cache", true},
                                  {"tie_word_embeddings", true}};
  if (c.vocab_size > kGpt2EndOfText) {  // GPT-2's tokenizer's <|endoftext|> exists in this vocabulary
    j["bos_token_id"] = kGpt2EndOfText;
    j["eos_token_id"] = kGpt2EndOfText;
  }
  return j.dump(2) + "\n";
}

GptConfig gpt_config_from_hf_gpt2(const std::string& json_text, const std::string& source) {
  const auto j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  MPIDDP_CHECK(j.is_object(), source + " is not a JSON object");
  const auto model_type = j.value("model_type", std::string("(none)"));
  MPIDDP_CHECK(model_type == "gpt2", source + ": model_type '" + model_type +
                                         "' is not gpt2: only GPT-2 checkpoints load into the built-in GPT");
  GptConfig c;
  try {  // a key left out has GPT2Config's default, as transformers reads it
    c.vocab_size = j.value("vocab_size", int64_t{50257});
    c.block_size = j.value("n_positions", int64_t{1024});
    c.n_embd = j.value("n_embd", int64_t{768});
    c.n_layer = j.value("n_layer", int64_t{12});
    c.n_head = j.value("n_head", int64_t{12});
    c.dropout = j.value("resid_pdrop", 0.1);
    c.activation = activation_from_hf(j.value("activation_function", std::string("gelu_new")), source);
    c.bias = true;
    const auto inner = j.find("n_inner");
    MPIDDP_CHECK(inner == j.end() || inner->is_null() || inner->get<int64_t>() == 4 * c.n_embd,
                 source + ": n_inner " + (inner == j.end() ? "" : inner->dump()) +
                     " is not 4 x n_embd, the built-in GPT's MLP width");
    const double epsilon = j.value("layer_norm_epsilon", kLayerNormEpsilon);
    MPIDDP_CHECK(epsilon == kLayerNormEpsilon,
                 source + ": layer_norm_epsilon " + std::to_string(epsilon) + " is not the built-in GPT's 1e-5");
    MPIDDP_CHECK(j.value("tie_word_embeddings", true), source +
                                                           ": tie_word_embeddings is false: the built-in GPT ties "
                                                           "its output head to the token embedding");
    MPIDDP_CHECK(j.value("scale_attn_weights", true) && !j.value("scale_attn_by_inverse_layer_idx", false),
                 source + ": attention scaled otherwise than by 1/sqrt(head size), as the built-in GPT's is");
    MPIDDP_CHECK(!j.value("add_cross_attention", false), source + ": cross-attention is not in the built-in GPT");
  } catch (const json::exception& e) {
    MPIDDP_THROW(source + ": a GPT2Config key has the wrong type (" + std::string(e.what()) + ")");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    MPIDDP_THROW(source + ": " + e.message());
  }
  return c;
}

std::vector<std::pair<std::string, torch::Tensor>> hf_gpt2_state(const GptConfig& config,
                                                                 const std::map<std::string, torch::Tensor>& ours) {
  const auto wte = ours.find(kTokenEmbedding);
  MPIDDP_CHECK(wte != ours.end(), std::string("the GPT's state lacks ") + kTokenEmbedding);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& t : gpt2_tensors(config)) {
    const auto it = ours.find(t.name);
    if (it == ours.end() && t.bias && !config.bias) {  // GPT-2 has biases: zero ones compute the same
      out.emplace_back(t.name, torch::zeros(t.shape, wte->second.options()));
      continue;
    }
    MPIDDP_CHECK(it != ours.end(), "the GPT's state lacks " + t.name);
    MPIDDP_CHECK(
        it->second.sizes() == c10::IntArrayRef(t.shape),
        "the GPT's " + t.name + " is " + shape_text(it->second.sizes()) + ", its shape says " + shape_text(t.shape));
    out.emplace_back(t.name, t.conv1d ? it->second.t().contiguous() : it->second);
  }
  return out;
}

std::map<std::string, torch::Tensor> gpt_state_from_hf_gpt2(const GptConfig& config,
                                                            const std::map<std::string, torch::Tensor>& hf,
                                                            const std::string& source) {
  // GPT2LMHeadModel's names start with "transformer.", GPT2Model's (the bare transformer) do not.
  std::map<std::string, torch::Tensor> theirs;
  for (const auto& [name, t] : hf) {
    theirs[name.rfind(kPrefix, 0) == 0 || name == kHead ? name : kPrefix + name] = t;
  }
  std::map<std::string, torch::Tensor> ours;
  for (const auto& t : gpt2_tensors(config)) {
    const auto it = theirs.find(t.name);
    MPIDDP_CHECK(it != theirs.end(), source + " lacks tensor " + t.name);
    const auto want = hf_shape(t);
    MPIDDP_CHECK(it->second.sizes() == c10::IntArrayRef(want), source + ": " + t.name + " is " +
                                                                   shape_text(it->second.sizes()) +
                                                                   " but config.json makes it " + shape_text(want));
    if (t.bias && !config.bias) {
      MPIDDP_CHECK(!it->second.any().item<bool>(), source + ": " + t.name + " is not zero, the GPT has no biases");
    } else {
      ours[t.name] = t.conv1d ? it->second.t().contiguous() : it->second;
    }
    theirs.erase(it);
  }
  for (const auto& [name, t] : theirs) {
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // the causal mask
    MPIDDP_CHECK(name == kHead, source + ": tensor " + name + " is not GPT-2's");
    MPIDDP_CHECK(torch::equal(t.to(ours[kTokenEmbedding].dtype()), ours[kTokenEmbedding]),
                 source + ": lm_head.weight differs from transformer.wte.weight: the built-in GPT ties them");
  }
  ours[kHead] = ours[kTokenEmbedding];
  return ours;
}

GptConfig read_hf_gpt2_config(const std::string& dir) {
  const auto path = (std::filesystem::path(dir) / kConfigFile).string();
  MPIDDP_CHECK(
      std::filesystem::is_regular_file(path),
      "'" + dir + "' has no config.json (a Hugging Face model directory holds config.json and model.safetensors)");
  return gpt_config_from_hf_gpt2(read_text(path), path);
}

std::map<std::string, torch::Tensor> read_hf_gpt2_state(const std::string& dir, const GptConfig& config) {
  const auto path = (std::filesystem::path(dir) / kWeightsFile).string();
  MPIDDP_CHECK(std::filesystem::is_regular_file(path),
               "'" + dir + "' has no model.safetensors (one file of safetensors weights, as save_pretrained() writes)");
  return gpt_state_from_hf_gpt2(config, read_safetensors(path).tensors, path);
}

void write_hf_gpt2(const std::string& dir, const GptConfig& config, const std::map<std::string, torch::Tensor>& ours) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MPIDDP_CHECK(std::filesystem::is_directory(dir), "cannot create directory '" + dir + "'");
  write_safetensors((std::filesystem::path(dir) / kWeightsFile).string(), hf_gpt2_state(config, ours),
                    {{"format", "pt"}});  // transformers' own files say so
  const auto path = (std::filesystem::path(dir) / kConfigFile).string();
  std::ofstream out(path, std::ios::trunc);
  out << hf_gpt2_config_json(config);
  out.close();
  MPIDDP_CHECK(!out.fail(), "cannot write '" + path + "'");
}

}  // namespace mpiddp
