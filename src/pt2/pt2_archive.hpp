// Internal: a .pt2 archive (torch.export.save, PyTorch's PT2 Archive Spec) in memory: its programs'
// JSON (models/<name>.json), its weights (data/weights/*) and constants (data/constants/*), and
// the same archive written again with other weight values. The zip is libtorch's
// PyTorchStreamReader/Writer, the JSON nlohmann's.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace mpiddp::detail {

using Json = nlohmann::ordered_json;

/// A tensor the archive stores: its values on the CPU, whether it is a parameter, and the blob
/// that holds it (tied weights share one blob, and one tensor here).
struct StoredTensor {
  torch::Tensor tensor;
  bool is_param = false;
  bool requires_grad = false;
  std::string blob;
};

/// Stored tensors by their names (a parameter's or buffer's dotted name, a constant's name), in
/// the archive's order.
using StoredTensors = std::vector<std::pair<std::string, StoredTensor>>;

class Pt2Archive {
 public:
  /// Opens the archive's bytes, which must outlive it (read in place, never copied whole); `name`
  /// names it in messages. Throws mpiddp::Error (one line) when they are not a .pt2 archive (not a
  /// zip, no archive_format "pt2", no program).
  Pt2Archive(const std::string& bytes, std::string name);
  ~Pt2Archive();
  Pt2Archive(const Pt2Archive&) = delete;
  Pt2Archive& operator=(const Pt2Archive&) = delete;

  const std::string& name() const { return name_; }
  const std::string& bytes() const { return bytes_; }
  /// The programs it holds ("model", and "eval" where one was saved beside it), sorted.
  std::vector<std::string> programs() const;
  bool has_program(const std::string& program) const;
  /// models/<program>.json, parsed.
  Json program(const std::string& program) const;
  /// A program's data/weights (parameters and persistent buffers) and data/constants (constants
  /// and non-persistent buffers), each as its config file lists them.
  StoredTensors weights(const std::string& program) const;
  StoredTensors constants(const std::string& program) const;

  /// The archive again, every record as it is but the weight blobs, which hold `values` (by the
  /// names weights() gives, for every program; each must be there, of the stored shape).
  std::string with_weights(const std::map<std::string, torch::Tensor>& values) const;

 private:
  std::string record(const std::string& path) const;
  bool has_record(const std::string& path) const;
  StoredTensors stored(const std::string& folder, const std::string& config) const;

  const std::string& bytes_;
  std::string name_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
};

/// c10's values for the archive's serialized enums (torch/_export/serde/schema.py numbers its
/// ScalarType, Layout and MemoryFormat its own way); mpiddp::Error naming `where` for one c10 lacks.
c10::ScalarType scalar_type_of(int64_t serialized, const std::string& where);
c10::Layout layout_of(int64_t serialized, const std::string& where);
c10::MemoryFormat memory_format_of(int64_t serialized, const std::string& where);

}  // namespace mpiddp::detail
