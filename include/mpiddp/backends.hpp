// The backends, described once: every ProcessGroup backend mpiddp knows, whether this binary has it,
// where its tensors may live and how it is made. The CLIs, `mpiddp info`, the Trainer and the tests
// read this table; a new backend is its file pair, one row here and its CMake option.
#pragma once

#include <mpiddp/process_group.hpp>

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp {

struct BackendSpec {
  std::string name;
  std::string summary;
  bool built = false;                          ///< compiled into this binary
  bool takes_cpu = false;                      ///< CPU tensors
  bool takes_cuda = false;                     ///< CUDA tensors
  c10::DeviceType default_device = c10::kCPU;  ///< where its tensors live unless told
  /// Makes the group (collective over runtime.world()); empty when not built.
  std::function<std::unique_ptr<ProcessGroup>(const Runtime&, const CommOptions&)> make;
};

/// Every backend mpiddp knows, built or not: mpi, nccl, gloo.
const std::vector<BackendSpec>& backends();
/// The row named `name`, or nullptr.
const BackendSpec* find_backend(const std::string& name);
/// The backends' names in the table's order, joined by `separator` ("mpi|nccl|gloo" for "|"): every
/// one mpiddp knows, or with `built_only` those built into this binary.
std::string backend_names(const std::string& separator, bool built_only = false);

/// The one rule for a backend and a device: `name` is built into this binary, takes tensors on
/// `device`, and a CUDA device is usable on this rank (this libtorch has CUDA and the rank a GPU).
/// Throws mpiddp::Error (one line) naming the flag or field as `what` ("--device cuda").
void check_backend(const std::string& name, c10::Device device, const Runtime& runtime, const std::string& what);

}  // namespace mpiddp
