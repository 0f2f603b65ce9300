#include "common/check_hdf5.hpp"

#include <vector>

namespace mpiddp::detail {

std::string hdf5_error_text() {
  std::vector<std::string> lines;
  auto walk = [](unsigned, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::vector<std::string>*>(data);
    std::string line = err->func_name ? err->func_name : "";
    if (err->desc && *err->desc) line += std::string(line.empty() ? "" : ": ") + err->desc;
    out->push_back(line);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &lines);
  H5Eclear2(H5E_DEFAULT);
  if (lines.empty()) return "HDF5 reported an error without details";
  // The outermost entry says what was attempted, the innermost why it failed.
  std::string text = lines.front();
  if (lines.size() > 1) text += " (" + lines.back() + ")";
  return text;
}

void write_scalar_attr(hid_t obj, const std::string& name, hid_t type, const void* value) {
  Hid space(MPIDDP_CHECK_HDF5(H5Screate(H5S_SCALAR)), H5Sclose);
  Hid a(MPIDDP_CHECK_HDF5(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  MPIDDP_CHECK_HDF5(H5Awrite(a.get(), type, value));
}

void quiet_hdf5() {
  static const bool once = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
}

}  // namespace mpiddp::detail
