// The built-in GPT as Hugging Face transformers' GPT-2 (GPT2LMHeadModel) and back: one table of
// names and layouts (hf_gpt2.cpp) read both ways, and GptConfig <-> GPT2Config's config.json.
//   names: the same as ours (nanoGPT took GPT-2's), transformer.wte/.wpe/.h.{i}.*/.ln_f; lm_head
//          is tied to transformer.wte, so Hugging Face leaves it out of its files.
//   layout: GPT-2's attention and MLP weights are Conv1D's [in, out], ours nn::Linear's [out, in].
// A directory is config.json + model.safetensors, as save_pretrained() writes it.
#pragma once

#include <mpiddp/gpt.hpp>

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp {

/// config.json for `config`: GPT2Config's keys (model_type gpt2, n_positions = block size, the
/// activation's name, LayerNorm epsilon 1e-5, tied embeddings, the dropout as all three pdrops).
std::string hf_gpt2_config_json(const GptConfig& config);

/// The GptConfig of a GPT2Config's JSON text (`source` names it in messages). Throws mpiddp::Error
/// (one line) for another model_type or a GPT-2 the built-in GPT cannot be (untied head, an MLP
/// not 4x wide, another epsilon or activation). Biases always: GPT-2 has them.
GptConfig gpt_config_from_hf_gpt2(const std::string& json_text, const std::string& source);

/// The GPT's state (our names: a snapshot's or state_dict's model tensors) as Hugging Face's
/// tensors, in our order: Conv1D weights transposed, lm_head left out; a GPT without biases gets
/// zero ones (GPT-2 always has them). Throws mpiddp::Error naming a tensor missing from `ours`.
std::vector<std::pair<std::string, torch::Tensor>> hf_gpt2_state(const GptConfig& config,
                                                                 const std::map<std::string, torch::Tensor>& ours);

/// Hugging Face's GPT-2 tensors (with or without the "transformer." prefix; lm_head.weight, when
/// present, must equal the token embedding; the attention's mask buffers attn.bias and
/// attn.masked_bias are ignored) as the GPT's state by our names, lm_head.weight included.
/// Throws mpiddp::Error (one line, naming `source`) for a tensor missing, of another shape than
/// `config` gives it, or unknown.
std::map<std::string, torch::Tensor> gpt_state_from_hf_gpt2(const GptConfig& config,
                                                            const std::map<std::string, torch::Tensor>& hf,
                                                            const std::string& source);

/// A save_pretrained() directory: DIR/config.json's GptConfig.
GptConfig read_hf_gpt2_config(const std::string& dir);
/// DIR/model.safetensors as the state of a GPT of `config` (our names).
std::map<std::string, torch::Tensor> read_hf_gpt2_state(const std::string& dir, const GptConfig& config);
/// Writes DIR (created if missing): config.json and model.safetensors of the GPT `ours`.
void write_hf_gpt2(const std::string& dir, const GptConfig& config, const std::map<std::string, torch::Tensor>& ours);

}  // namespace mpiddp
