// The built-in models of `mpiddp train --model` and TorchScript files given there. The library
// trains any mpiddp::Model; these are the CLI's.
#pragma once

#include <mpiddp/data.hpp>
#include <mpiddp/gpt.hpp>
#include <mpiddp/model.hpp>

#include <memory>
#include <string>

namespace mpiddp::app {

/// linear: `fc` = Linear(in, out) on the flattened inputs (the seeds' Linear(20, 1));
/// mlp: fc1 = Linear(in, 128), ReLU, fc2 = Linear(128, 64), ReLU, fc3 = Linear(64, out);
/// cnn: PyTorch's examples/mnist `Net`, with its parameter names (conv1, conv2, fc1, fc2), needs
/// [1, 28, 28] inputs and 10 classes; gpt: nanoGPT's GPT of `gpt`'s shape (gpt.hpp), needs token
/// data of its block size. Anything else names a TorchScript file.
/// out = the classes, or the regression targets' width.
std::shared_ptr<Model> make_model(const std::string& spec, const DatasetInfo& data, const GptConfig& gpt = {});

}  // namespace mpiddp::app
