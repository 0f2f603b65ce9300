// The one place where libtorch version differences are handled. Everything else includes
// this header and uses the names below, never TORCH_VERSION arithmetic of its own.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <mpiddp/config.hpp>

#include <sstream>
#include <string>
#include <utility>

#define MPIDDP_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace mpiddp::compat {

/// libtorch's version as "major.minor.patch".
inline const char* torch_version() { return TORCH_VERSION; }

namespace detail {
// libtorch 1.x keys torch::optim::Optimizer::state() by the text of the parameter's TensorImpl
// address (c10::guts::to_string, i.e. ostream <<); 2.x by the address itself.
inline std::string state_key(const void* impl, std::string*) {
  std::ostringstream s;
  s << impl;
  return s.str();
}
inline void* state_key(const void* impl, void**) { return const_cast<void*>(impl); }
}  // namespace detail

/// The key under which `state` (an Optimizer::state() map) holds the state of the parameter whose
/// TensorImpl is `impl` (p.unsafeGetTensorImpl()), whichever key type this libtorch uses.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap& /*state*/, const void* impl) {
  return detail::state_key(impl, static_cast<typename StateMap::key_type*>(nullptr));
}

/// A held reference to a parameter's AccumulateGrad node, as impl::grad_accumulator() returns it:
/// std::shared_ptr<Node> up to libtorch 2.12, c10::intrusive_ptr<Node> from 2.13 (detected from the
/// function's own return type).
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

namespace detail {
template <class Options>
auto classic_tcp_store(Options& o, int) -> decltype(o.useLibUV = false, void()) {
  o.useLibUV = false;
}
template <class Options>
void classic_tcp_store(Options&, long) {}
}  // namespace detail

/// Asks c10d's TCPStore for its classic socket implementation. libtorch 2.x defaults to a libuv one
/// that builds without libuv (Debian's) refuse at run time ("use_libuv was requested but PyTorch
/// was built without libuv support"); older versions have no such member and only the classic one.
template <class TCPStoreOptions>
void use_classic_tcp_store(TCPStoreOptions& options) {
  detail::classic_tcp_store(options, 0);
}

/// Whether c10d's Gloo reduces float16 / bfloat16. Read from the gloo/config.h libtorch was built
/// with where it says (GLOO_USE_TORCH_DTYPES, see cmake/TorchFeatures.cmake). A gloo older than
/// that macro carries float16 natively, and bfloat16 only through c10d's own support, which came
/// with libtorch 2.1: the one gate here that no header can answer, so a version decides it.
#if MPIDDP_GLOO_BFLOAT16 < 0
#define MPIDDP_GLOO_HAS_BFLOAT16 MPIDDP_TORCH_VERSION_AT_LEAST(2, 1)
#else
#define MPIDDP_GLOO_HAS_BFLOAT16 MPIDDP_GLOO_BFLOAT16
#endif
#define MPIDDP_GLOO_HAS_HALF MPIDDP_GLOO_HALF

/// Whether libtorch declares its fused multi-tensor Adam and AdamW kernels (aten::_fused_adam_,
/// aten::_fused_adamw_), from the headers that declare them. Which devices they run on is a
/// question for run time (mpiddp::fused_adam_runs, src/optim/optim.cpp).
#if __has_include(<ATen/ops/_fused_adam.h>)
#define MPIDDP_HAS_FUSED_ADAM 1
#else
#define MPIDDP_HAS_FUSED_ADAM 0
#endif
#if __has_include(<ATen/ops/_fused_adamw.h>)
#define MPIDDP_HAS_FUSED_ADAMW 1
#else
#define MPIDDP_HAS_FUSED_ADAMW 0
#endif

/// Whether libtorch has at::scaled_dot_product_attention (2.0+; the built-in GPT's attention uses
/// it, else the explicit softmax(QK^T / sqrt(d) + causal mask) V).
#if __has_include(<ATen/ops/scaled_dot_product_attention.h>)
#define MPIDDP_HAS_SDPA 1
#else
#define MPIDDP_HAS_SDPA 0
#endif

/// Whether libtorch has the multi-tensor kernels gradient clipping uses on CUDA (a handful of
/// kernels for the whole model instead of a few per parameter, as PyTorch's clip_grad_norm_):
/// at::_foreach_norm with a result dtype and at::_foreach_mul_ by a 0-dim tensor (2.x; 1.13 has
/// neither, and a tensor there converts silently to a one-tensor list).
#define MPIDDP_HAS_FOREACH_CLIPPING MPIDDP_TORCH_VERSION_AT_LEAST(2, 4)

/// Whether mpiddp trains .pt2 programs (torch.export; src/pt2): their training IR and archive
/// format are PyTorch 2.6's (torch.export.export's default IR since then); 1.x has neither.
#define MPIDDP_HAS_PT2 MPIDDP_TORCH_VERSION_AT_LEAST(2, 6)

/// Autocast's per-device switches. libtorch 2.4 made them one API keyed by device type and
/// deprecated the per-device functions (is_cpu_enabled, set_autocast_gpu_dtype, ...) that 1.x has;
/// both are declared in the same header, so the version decides which is called.
inline bool autocast_enabled(c10::DeviceType device) {
#if MPIDDP_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if MPIDDP_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}
inline void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
#if MPIDDP_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace mpiddp::compat
