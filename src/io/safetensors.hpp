// Hugging Face's safetensors format (https://huggingface.co/docs/safetensors), read and written:
//   8 bytes: N, the header's length (uint64, little-endian)
//   N bytes: a JSON object {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]}, ...,
//            "__metadata__": {"key": "text", ...}}, padded with spaces so that the data starts 8-aligned
//   the data: every tensor's bytes (little-endian, row-major), offsets relative to the data's start.
// The writer lays tensors out as the safetensors library does (largest dtype first, then by name:
// each tensor aligned to its element), so that Python's save_file writes the same bytes. The reader
// holds a file to the library's rules: a file that breaks one is refused with one line naming it.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mpiddp {

/// A safetensors file's content: CPU tensors by name and the header's "__metadata__".
struct SafetensorsFile {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (any device and layout: copied to contiguous CPU; dtypes F64, F32, F16, BF16,
/// I64, I32, I16, I8, U8, BOOL) and `metadata` to `path`, through a temporary file renamed over it.
/// Throws mpiddp::Error (one line) for a name given twice, an unsupported dtype or a failed write.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads a safetensors file. Throws mpiddp::Error, one line naming the file and the fault, for a
/// missing or truncated file, a header that is no JSON object, a name given twice, an unknown
/// dtype, a shape whose bytes disagree with its offsets, offsets that overlap, leave gaps or do not
/// cover the data exactly.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace mpiddp
