// Internal: check macro for HDF5 calls. HDF5 returns negative ids/statuses on failure and keeps
// its own error stack; the innermost messages become the error text.
#pragma once

#include <mpiddp/error.hpp>

#include <hdf5.h>

#include <string>
#include <utility>

namespace mpiddp::detail {

/// HDF5's current error stack as one line ("H5Fopen: unable to open file: ..."), then cleared.
std::string hdf5_error_text();

/// Writes the scalar attribute `name` of `type` (the value at `value`) on `obj`; throws Error.
void write_scalar_attr(hid_t obj, const std::string& name, hid_t type, const void* value);

/// Stops HDF5 printing its error stack to stderr (mpiddp turns errors into exceptions). Idempotent.
void quiet_hdf5();

/// RAII, move-only owner of one hid_t (file, dataset, dataspace, type, property list, attribute,
/// group) with the H5?close function that frees it.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  /// Gives up ownership (for a close whose status matters: the caller closes it).
  hid_t release() { return std::exchange(id_, -1); }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

}  // namespace mpiddp::detail

#define MPIDDP_CHECK_HDF5(call)                                                                               \
  ([&]() {                                                                                                    \
    auto mpiddp_h5_ = (call);                                                                                 \
    if (mpiddp_h5_ < 0) {                                                                                     \
      throw ::mpiddp::Error(std::string(#call) + " failed: " + ::mpiddp::detail::hdf5_error_text(), __FILE__, \
                            __LINE__);                                                                        \
    }                                                                                                         \
    return mpiddp_h5_;                                                                                        \
  }())
