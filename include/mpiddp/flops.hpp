// Device peaks, for a training run's MFU (model FLOPs utilization: the model's FLOPs trained per
// second over the job's dense peak, as PaLM and nanoGPT define it). Model FLOPs are the model's own
// arithmetic (Model::training_flops_per_sample, FlopCounted in model.hpp), one forward and one
// backward per sample: recompute (activation checkpointing) and padding do not count, so MFU
// compares runs of one model fairly.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace mpiddp {

/// The dense (never 2:4-sparse) peak FLOP/s of one device, by its CUDA name as
/// cudaGetDeviceProperties reports it ("NVIDIA H100 80GB HBM3"), at `precision`: kBFloat16 and
/// kHalf (tensor cores), kFloat (plain fp32, no TF32: libtorch's default). nullopt for a name or
/// precision the table does not know (the CPU, another GPU): no MFU rather than a wrong one.
std::optional<double> dense_peak_flops(const std::string& device_name, c10::ScalarType precision);

}  // namespace mpiddp
