// Internal: tensors counted once. A tensor under two names (tied weights: the GPT's token embedding
// is its head) is one tensor, identified by its TensorImpl; every count or list of a model's
// parameters (the model's, DDP's, the memory plan's, the GPT's parameter count) goes through here.
#pragma once

#include <torch/types.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp::detail {

/// `named` with each tensor under its first name only, in order (PyTorch's named_parameters()).
inline std::vector<std::pair<std::string, torch::Tensor>> distinct(
    const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::set<const void*> seen;
  for (const auto& item : named) {
    if (seen.insert(item.second.unsafeGetTensorImpl()).second) out.push_back(item);
  }
  return out;
}

/// `tensors` each once, in order.
inline std::vector<torch::Tensor> distinct(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (const auto& t : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

}  // namespace mpiddp::detail
