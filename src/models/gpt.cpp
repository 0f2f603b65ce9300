// The built-in GPT (see include/mpiddp/gpt.hpp): nanoGPT's model.py, module by module.
#include <mpiddp/allocator.hpp>
#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/gpt.hpp>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/distinct.hpp"
#include "common/text.hpp"

namespace mpiddp {

namespace nn = torch::nn;

using detail::ends_with;

namespace {

// nanoGPT's LayerNorm: a weight and an optional bias (nn::LayerNorm always has one).
struct LayerNormImpl : nn::Module {
  LayerNormImpl(int64_t width, bool bias) : width(width) {
    weight = register_parameter("weight", torch::ones({width}));
    if (bias) this->bias = register_parameter("bias", torch::zeros({width}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::layer_norm(x, {width}, weight, bias, 1e-5); }
  int64_t width;
  torch::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm);

// A module whose "weight" is a tensor it is given: the token embedding (an Embedding) and the
// output head (a Linear without bias) share one tensor this way, registered under both names.
struct SharedWeightImpl : nn::Module {
  explicit SharedWeightImpl(const torch::Tensor& w) { weight = register_parameter("weight", w); }
  torch::Tensor embed(const torch::Tensor& idx) { return torch::embedding(weight, idx); }
  torch::Tensor project(const torch::Tensor& x) { return torch::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(SharedWeight);

// x W^T + b through ATen's linear, as PyTorch's Python F.linear: one matmul with the bias in its
// epilogue (addmm) for the blocks' [B, T, C] inputs. The C++ frontend's nn::Linear::forward instead
// multiplies and then adds the bias, which under autocast is a bfloat16 product plus a float32
// bias: a separate, type-converting add over every output (on an H200, 9% of a GPT-2 step).
torch::Tensor linear(const nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

// softmax(q k^T / sqrt(d) + causal mask) v over [B, heads, T, head size].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                               bool training) {
  const double p = training ? dropout : 0.0;
#if MPIDDP_HAS_SDPA
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(k.size(-1))));
  const auto future = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  att = torch::softmax(att.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(torch::dropout(att, p, training), v);
#endif
}

struct CausalSelfAttentionImpl : nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : c_attn(register_module("c_attn", nn::Linear(nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)))),
        c_proj(register_module("c_proj", nn::Linear(nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)))),
        resid_dropout(register_module("resid_dropout", nn::Dropout(c.dropout))),
        n_head(c.n_head),
        dropout(c.dropout) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto qkv = linear(c_attn, x).split(c, 2);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, c / n_head}).transpose(1, 2); };
    auto y = causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), dropout, is_training());
    return resid_dropout(linear(c_proj, y.transpose(1, 2).contiguous().view({b, t, c})));
  }
  nn::Linear c_attn, c_proj;
  nn::Dropout resid_dropout;
  int64_t n_head;
  double dropout;
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : nn::Module {
  explicit MlpImpl(const GptConfig& c)
      : c_fc(register_module("c_fc", nn::Linear(nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)))),
        c_proj(register_module("c_proj", nn::Linear(nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)))),
        dropout(register_module("dropout", nn::Dropout(c.dropout))),
        gelu_approximate(c.activation == "gelu_new" ? "tanh" : "none") {}
  torch::Tensor forward(const torch::Tensor& x) {
    return dropout(linear(c_proj, torch::gelu(linear(c_fc, x), gelu_approximate)));
  }
  nn::Linear c_fc, c_proj;
  nn::Dropout dropout;
  std::string gelu_approximate;  // torch::gelu's name for the config's activation
};
TORCH_MODULE(Mlp);

struct BlockImpl : nn::Module {
  explicit BlockImpl(const GptConfig& c)
      : ln_1(register_module("ln_1", LayerNorm(c.n_embd, c.bias))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln_2(register_module("ln_2", LayerNorm(c.n_embd, c.bias))),
        mlp(register_module("mlp", Mlp(c))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  Mlp mlp;
};
TORCH_MODULE(Block);

struct TransformerImpl : nn::Module {
  TransformerImpl(const GptConfig& c, const torch::Tensor& token_embedding)
      : wte(register_module("wte", SharedWeight(token_embedding))),
        wpe(register_module("wpe", nn::Embedding(c.block_size, c.n_embd))),
        drop(register_module("drop", nn::Dropout(c.dropout))),
        h(register_module("h", nn::ModuleList())),
        ln_f(nullptr) {
    // Each part deferred as soon as it is built (units.hpp): the whole model never has memory here.
    defer_parameters(*wpe);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      Block block(c);
      defer_parameters(*block);
      h->push_back(block);
    }
    ln_f = register_module("ln_f", LayerNorm(c.n_embd, c.bias));
    defer_parameters(*ln_f);
    // The parts' tensors as built are freed for good: under the training thresholds (allocator.hpp)
    // malloc would keep them resident (36 blocks of GPT-2's width: ~370 MiB a rank, until the units'
    // initialisation trimmed them), and the memory plan would read them as the process's own.
    release_free_memory();
  }
  static void defer_parameters(const nn::Module& m) {
    for (const auto& p : m.parameters(/*recurse=*/true)) defer(p);
  }
  SharedWeight wte;
  nn::Embedding wpe;
  nn::Dropout drop;
  nn::ModuleList h;
  LayerNorm ln_f;
};
TORCH_MODULE(Transformer);

// ZeRO stage 3's embeddings unit: transformer.wte and .wpe as one group, no child of the model (so
// that their names stay nanoGPT's).
struct EmbeddingsImpl : nn::Module {
  explicit EmbeddingsImpl(const Transformer& t) {
    register_module("wte", t->wte);
    register_module("wpe", t->wpe);
  }
};
TORCH_MODULE(Embeddings);

}  // namespace

struct GptImpl::Parts {
  Transformer transformer{nullptr};
  SharedWeight lm_head{nullptr};
  Embeddings embeddings{nullptr};
};

void GptConfig::validate() const {
  MPIDDP_CHECK(block_size > 0 && vocab_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
               "the GPT's block size, vocabulary size, layers, heads and width must be > 0");
  MPIDDP_CHECK(n_embd % n_head == 0, "the GPT's width (n_embd " + std::to_string(n_embd) +
                                         ") must be a multiple of its heads (n_head " + std::to_string(n_head) + ")");
  MPIDDP_CHECK(dropout >= 0 && dropout < 1, "the GPT's dropout must be in [0, 1), got " + std::to_string(dropout));
  MPIDDP_CHECK(activation == "gelu" || activation == "gelu_new",
               "the GPT's activation must be gelu (exact) or gelu_new (tanh approximation), got '" + activation + "'");
}

std::string GptConfig::to_json() const {
  return nlohmann::json{
      {"block_size", block_size}, {"vocab_size", vocab_size}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_embd", n_embd},         {"dropout", dropout},       {"bias", bias},       {"activation", activation}}
      .dump();
}

GptConfig GptConfig::from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  MPIDDP_CHECK(j.is_object(), "a GPT configuration must be a JSON object, got '" + text + "'");
  GptConfig c;
  try {
    c.block_size = j.at("block_size").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.dropout = j.at("dropout").get<double>();
    c.bias = j.at("bias").get<bool>();
    c.activation = j.value("activation", std::string("gelu"));  // absent before the field existed
  } catch (const nlohmann::json::exception& e) {
    MPIDDP_THROW("a GPT configuration lacks a field or has one of the wrong type: " + std::string(e.what()));
  }
  c.validate();
  return c;
}

GptImpl::GptImpl(const GptConfig& config, ParameterInit init) : config_(config), parts_(std::make_shared<Parts>()) {
  config_.validate();
  const auto& c = config_;
  const auto token_embedding = deferred_tensor({c.vocab_size, c.n_embd}, torch::TensorOptions());
  parts_->transformer = register_module("transformer", Transformer(c, token_embedding));
  parts_->lm_head = register_module("lm_head", SharedWeight(token_embedding));
  parts_->embeddings = Embeddings(parts_->transformer);
  if (init == ParameterInit::kNow) materialise_units(*this);
  // nanoGPT's get_num_params(non_embedding=True): each tensor once (wte is lm_head), less wpe.
  for (const auto& p : detail::distinct(parameters(/*recurse=*/true))) non_embedding_params_ += p.numel();
  non_embedding_params_ -= parts_->transformer->wpe->weight.numel();
}

double GptImpl::training_flops_per_sample(int64_t sample_tokens) const {
  // Per token: 6 FLOPs per weight (2 forward, 4 backward: PaLM's appendix B) and 12 L C T for
  // attention's scores and weighted sums, as nanoGPT's estimate_mfu counts them; T is the sample's
  // tokens (the data's block size, at most the model's). Recompute under activation checkpointing
  // is not counted: MFU counts the model's FLOPs, not the hardware's.
  const auto n = static_cast<double>(non_embedding_params_), t = static_cast<double>(sample_tokens);
  const auto l = static_cast<double>(config_.n_layer), c = static_cast<double>(config_.n_embd);
  return (6.0 * n + 12.0 * l * c * t) * t;
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  MPIDDP_CHECK(idx.dim() == 2,
               "the GPT takes token ids [batch, time], got " + std::to_string(idx.dim()) + " dimensions");
  const int64_t t = idx.size(1);
  MPIDDP_CHECK(t <= config_.block_size, "cannot forward a sequence of length " + std::to_string(t) +
                                            ", the block size is only " + std::to_string(config_.block_size));
  // Units (ZeRO stage 3): the embeddings, each block, the head (which reads the embeddings' wte).
  auto& tr = *parts_->transformer;
  auto x = run_unit(
      0,
      [&tr](const torch::Tensor& tokens) {
        const auto pos =
            torch::arange(tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
        return tr.drop(tr.wte->embed(tokens) + tr.wpe(pos));
      },
      idx);
  for (size_t i = 0; i < tr.h->size(); ++i) {
    auto* block = tr.h[i]->as<BlockImpl>();
    x = run_unit(
        i + 1,
        [this, block](const torch::Tensor& in) {
          return checkpointing_ ? checkpoint([block](const torch::Tensor& t) { return block->forward(t); }, in,
                                             block->parameters())
                                : block->forward(in);
        },
        x);
  }
  const size_t head = tr.h->size() + 1;
  return run_unit(head, [this, &tr](const torch::Tensor& in) { return parts_->lm_head->project(tr.ln_f(in)); }, x,
                  /*borrowed=*/{0});
}

// nanoGPT's _init_weights (weights normal with std 0.02, biases zero, LayerNorms ones and zeros), the
// residual projections' std 0.02 / sqrt(2 n_layer); drawn on the CPU, each tensor once, in the units'
// order (the tied wte/lm_head weight in the embeddings unit).
void GptImpl::init_unit(size_t unit) {
  torch::NoGradGuard no_grad;
  const bool head = unit == parts_->transformer->h->size() + 1;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (auto& item : units().at(unit)->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const bool bias = ends_with(name, "bias");
    torch::Tensor value;
    if (head || name.rfind("ln_", 0) == 0) {
      value = bias ? torch::zeros(item.value().sizes()) : torch::ones(item.value().sizes());
    } else if (bias) {
      value = torch::zeros(item.value().sizes());
    } else {
      value = torch::empty(item.value().sizes()).normal_(0.0, ends_with(name, "c_proj.weight") ? residual_std : 0.02);
    }
    item.value().copy_(value);
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> GptImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> units{parts_->embeddings.ptr()};
  for (const auto& block : *parts_->transformer->h) units.push_back(block);
  units.push_back(parts_->transformer->ln_f.ptr());
  return units;
}

torch::Tensor GptImpl::generate(torch::Tensor idx, int64_t max_new_tokens, double temperature, int64_t top_k) {
  MPIDDP_CHECK(temperature > 0, "the temperature must be > 0, got " + std::to_string(temperature));
  MPIDDP_CHECK(top_k >= 0, "top_k must be >= 0 (0: all tokens), got " + std::to_string(top_k));
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t t = idx.size(1);
    const auto context = t <= config_.block_size ? idx : idx.narrow(1, t - config_.block_size, config_.block_size);
    auto logits = forward(context).select(1, context.size(1) - 1) / temperature;
    if (top_k > 0) {  // below the k-th largest: never drawn
      const int64_t k = std::min(top_k, logits.size(-1));
      const auto kth = std::get<0>(logits.topk(k)).narrow(-1, k - 1, 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
    }
    idx = torch::cat({idx, torch::multinomial(torch::softmax(logits, -1), 1)}, 1);
  }
  return idx;
}

}  // namespace mpiddp
