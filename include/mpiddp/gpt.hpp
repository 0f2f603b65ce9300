// The built-in GPT: nanoGPT's model (Karpathy's nanoGPT, model.py) in libtorch, by its parameter
// names and numbers, so that a state_dict moves between the two in either direction:
//   transformer.wte, transformer.wpe, transformer.h.{i}.ln_1, .attn.c_attn (C -> 3C),
//   .attn.c_proj, .ln_2, .mlp.c_fc (C -> 4C), .mlp.c_proj, transformer.ln_f, lm_head (no bias).
// lm_head's weight IS transformer.wte's (one tensor registered under both names): it is one
// parameter to DDP and the optimizer, and its gradient is the sum of both uses.
// LayerNorm eps 1e-5 (bias optional, as nanoGPT's own LayerNorm), exact GELU (or GPT-2's tanh
// approximation, GptConfig::activation "gelu_new", for OpenAI's checkpoints), causal attention
// scaled by 1/sqrt(head size) (PyTorch's scaled_dot_product_attention where the linked libtorch has
// it, the explicit form otherwise), dropout on embeddings, attention and residuals.
// Initialisation: normal(0, 0.02) for every Linear and Embedding weight, zero biases, and every
// *.c_proj.weight normal(0, 0.02 / sqrt(2 n_layer)).
#pragma once

#include <mpiddp/checkpoint.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/units.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace mpiddp {

/// nanoGPT's GPTConfig, with its defaults (GPT-2 small, vocabulary padded to 50304).
struct GptConfig {
  int64_t block_size = 1024;
  int64_t vocab_size = 50304;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  bool bias = true;  ///< biases in the Linears and LayerNorms
  /// The MLP's GELU: "gelu" (exact, erf: nanoGPT's) or "gelu_new" (the tanh approximation OpenAI's
  /// GPT-2 was trained with: Hugging Face's NewGELU, torch's gelu(x, "tanh")).
  std::string activation = "gelu";

  /// Throws mpiddp::Error (one line) for a shape that cannot be built (n_embd % n_head != 0, ...).
  void validate() const;
  /// As JSON text (snapshots keep it, so `mpiddp generate` needs no shape flags) and back; a text
  /// without "activation" (snapshots older than the field) is "gelu".
  std::string to_json() const;
  static GptConfig from_json(const std::string& text);
};

/// ZeRO stage 3's units (units.hpp): the embeddings (wte, wpe), each transformer block, and the head
/// (ln_f; it borrows the embeddings unit for lm_head's weight, which is wte).
class GptImpl : public torch::nn::Module, public Checkpointable, public UnitModule, public FlopCounted {
 public:
  /// Builds the model and initialises it (draws from the global CPU generator: seed it first), or
  /// leaves its parameters deferred (units.hpp): ZeRO stage 3 then initialises it unit by unit
  /// (init_unit), and never holds it whole; the same values either way.
  explicit GptImpl(const GptConfig& config, ParameterInit init = ParameterInit::kNow);
  /// Logits [B, T, vocab] of every position of `idx` [B, T] (int64 token ids, T <= block_size).
  torch::Tensor forward(const torch::Tensor& idx);
  /// nanoGPT's generate(): `max_new_tokens` times, crop the context to the last block_size
  /// tokens, take the last position's logits / temperature, keep the top_k largest (0: all),
  /// softmax, draw one token (torch::multinomial, the global generator) and append it.
  /// top_k 1 is greedy. Runs without gradient, in the mode the module is in (call eval()).
  torch::Tensor generate(torch::Tensor idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0);
  const GptConfig& config() const { return config_; }
  /// Each transformer block checkpointed in training (mpiddp::checkpoint): its activations are
  /// recomputed in backward instead of kept.
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }
  bool activation_checkpointing() const override { return checkpointing_; }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const override;
  void init_unit(size_t unit) override;
  /// nanoGPT's estimate_mfu: (6 N + 12 L C T) T for a sample of T tokens, N the parameters
  /// without the position embedding (the tied wte/lm_head weight once), L n_layer, C n_embd.
  double training_flops_per_sample(int64_t sample_tokens) const override;

 private:
  struct Parts;
  GptConfig config_;
  std::shared_ptr<Parts> parts_;
  bool checkpointing_ = false;
  int64_t non_embedding_params_ = 0;  ///< N above, counted when built
};
TORCH_MODULE(Gpt);

}  // namespace mpiddp
