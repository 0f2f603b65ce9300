// Device peaks for MFU (include/mpiddp/flops.hpp): NVIDIA's datasheet figures, dense.
#include <mpiddp/flops.hpp>

#include <array>

namespace mpiddp {

namespace {

struct DevicePeak {
  const char* name;          ///< exactly as cudaGetDeviceProperties names the device
  double half_flops_per_s;   ///< bf16 and fp16 on tensor cores, dense
  double float_flops_per_s;  ///< plain fp32 (no TF32)
};

// Exact names only: a near name (an H200 NVL, an A800, a GPU yet to come) has other figures, so it
// gets none. The datasheets print the 2:4-sparse tensor figures first: these are half of them.
constexpr std::array<DevicePeak, 8> kDevicePeaks{{
    {"NVIDIA H100 80GB HBM3", 989e12, 67e12},  // H100 SXM
    {"NVIDIA H200", 989e12, 67e12},            // H200 SXM
    {"NVIDIA H100 PCIe", 756e12, 51e12},
    {"NVIDIA H100 NVL", 835e12, 60e12},
    {"NVIDIA A100-SXM4-80GB", 312e12, 19.5e12},
    {"NVIDIA A100-SXM4-40GB", 312e12, 19.5e12},
    {"NVIDIA A100-PCIE-40GB", 312e12, 19.5e12},
    {"NVIDIA A100 80GB PCIe", 312e12, 19.5e12},
}};

}  // namespace

std::optional<double> dense_peak_flops(const std::string& device_name, c10::ScalarType precision) {
  for (const auto& device : kDevicePeaks) {
    if (device_name != device.name) continue;
    if (precision == c10::kBFloat16 || precision == c10::kHalf) return device.half_flops_per_s;
    if (precision == c10::kFloat) return device.float_flops_per_s;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace mpiddp
