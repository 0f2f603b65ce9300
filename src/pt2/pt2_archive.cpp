#include <mpiddp/compat.hpp>
#if MPIDDP_HAS_PT2

#include "pt2/pt2_archive.hpp"

#include <mpiddp/error.hpp>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstring>

#include "common/text.hpp"

namespace mpiddp::detail {

namespace {

// The archive's folders and files (torch/csrc/export/pt2_archive_constants.h).
constexpr const char* kArchiveFormat = "archive_format";
constexpr const char* kModelsFolder = "models/";
constexpr const char* kWeightsFolder = "data/weights/";      // + <program>_weights_config.json
constexpr const char* kConstantsFolder = "data/constants/";  // + <program>_constants_config.json
// What PyTorchStreamWriter writes of its own at the end (so not copied from the original).
const std::vector<std::string> kWriterOwnRecords = {".data/version", ".data/serialization_id", "version"};

// The archive's bytes as the zip reader reads them, without a copy.
class BytesReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

int64_t as_int(const Json& symbolic_int, const std::string& where) {
  MPIDDP_CHECK(symbolic_int.contains("as_int"), where + ": a symbolic size where a stored tensor needs a number");
  return symbolic_int.at("as_int").get<int64_t>();
}

std::vector<int64_t> as_ints(const Json& list, const std::string& where) {
  std::vector<int64_t> out;
  for (const auto& v : list) out.push_back(as_int(v, where));
  return out;
}

// A blob's bytes as a storage (torch.export.save writes one blob per storage: several tensors may
// view it, each at its own sizes, strides and offset).
torch::Tensor storage_of(const std::string& bytes) {
  auto storage = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kByte);
  std::memcpy(storage.data_ptr(), bytes.data(), bytes.size());
  return storage;
}

// One stored tensor: its tensor_meta's view of its blob's storage, as a leaf of its own (a
// parameter must be one), sharing the storage's memory.
torch::Tensor tensor_in_blob(const torch::Tensor& storage, const Json& meta, const std::string& where) {
  const auto dtype = scalar_type_of(meta.at("dtype").get<int64_t>(), where);
  MPIDDP_CHECK(layout_of(meta.at("layout").get<int64_t>(), where) == c10::kStrided,
               where + ": only strided (dense) tensors can be trained");
  const auto sizes = as_ints(meta.at("sizes"), where), strides = as_ints(meta.at("strides"), where);
  const int64_t offset = as_int(meta.at("storage_offset"), where);
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t last = offset;  // the furthest element the view reaches
  for (size_t d = 0; d < sizes.size(); ++d) last += sizes[d] > 0 ? (sizes[d] - 1) * strides[d] : 0;
  const bool empty = std::any_of(sizes.begin(), sizes.end(), [](int64_t s) { return s == 0; });
  MPIDDP_CHECK(empty || (last + 1) * item <= storage.numel(),
               where + ": its blob holds " + std::to_string(storage.numel()) + " bytes, too few for " +
                   shape_text(sizes) + " at offset " + std::to_string(offset));
  return torch::empty({0}, torch::TensorOptions().dtype(dtype)).set_(storage.storage(), offset, sizes, strides);
}

}  // namespace

c10::ScalarType scalar_type_of(int64_t serialized, const std::string& where) {
  static const std::map<int64_t, c10::ScalarType> table = {{1, c10::kByte},
                                                           {2, c10::kChar},
                                                           {3, c10::kShort},
                                                           {4, c10::kInt},
                                                           {5, c10::kLong},
                                                           {6, c10::kHalf},
                                                           {7, c10::kFloat},
                                                           {8, c10::kDouble},
                                                           {9, c10::kComplexHalf},
                                                           {10, c10::kComplexFloat},
                                                           {11, c10::kComplexDouble},
                                                           {12, c10::kBool},
                                                           {13, c10::kBFloat16},
                                                           {28, c10::kUInt16},
                                                           {29, c10::ScalarType::Float8_e4m3fn},
                                                           {30, c10::ScalarType::Float8_e5m2},
                                                           {31, c10::ScalarType::Float8_e4m3fnuz},
                                                           {32, c10::ScalarType::Float8_e5m2fnuz}};
  auto it = table.find(serialized);
  MPIDDP_CHECK(it != table.end(), where + ": unknown dtype number " + std::to_string(serialized));
  return it->second;
}

c10::Layout layout_of(int64_t serialized, const std::string& where) {
  static const std::map<int64_t, c10::Layout> table = {{1, c10::kSparse},    {2, c10::kSparseCsr}, {3, c10::kSparseCsc},
                                                       {4, c10::kSparseBsr}, {5, c10::kSparseBsc}, {6, c10::kMkldnn},
                                                       {7, c10::kStrided}};
  auto it = table.find(serialized);
  MPIDDP_CHECK(it != table.end(), where + ": unknown layout number " + std::to_string(serialized));
  return it->second;
}

c10::MemoryFormat memory_format_of(int64_t serialized, const std::string& where) {
  static const std::map<int64_t, c10::MemoryFormat> table = {{1, c10::MemoryFormat::Contiguous},
                                                             {2, c10::MemoryFormat::ChannelsLast},
                                                             {3, c10::MemoryFormat::ChannelsLast3d},
                                                             {4, c10::MemoryFormat::Preserve}};
  auto it = table.find(serialized);
  MPIDDP_CHECK(it != table.end(), where + ": unknown memory format number " + std::to_string(serialized));
  return it->second;
}

Pt2Archive::Pt2Archive(const std::string& bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {
  try {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(std::make_shared<BytesReader>(bytes_));
  } catch (const std::exception& e) {
    // libtorch's reason, to its first sentence (the rest is advice about checkpoints).
    const auto reason = first_line(e.what());
    MPIDDP_THROW("'" + name_ + "' is not a .pt2 archive (save one with torch.export.save): " +
                 reason.substr(0, reason.find(". ") == std::string::npos ? reason.size() : reason.find(". ") + 1));
  }
  MPIDDP_CHECK(has_record(kArchiveFormat) && record(kArchiveFormat).rfind("pt2", 0) == 0,
               "'" + name_ +
                   "' is a zip archive but not a .pt2 one (no archive_format 'pt2'; save one with "
                   "torch.export.save)");
  MPIDDP_CHECK(!programs().empty(), "'" + name_ + "' holds no program (no models/*.json)");
}

Pt2Archive::~Pt2Archive() = default;

bool Pt2Archive::has_record(const std::string& path) const { return reader_->hasRecord(path); }

std::string Pt2Archive::record(const std::string& path) const {
  MPIDDP_CHECK(has_record(path), "'" + name_ + "' has no " + path + " (a damaged or incomplete .pt2 archive)");
  try {
    auto [data, size] = reader_->getRecord(path);
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const std::exception& e) {
    MPIDDP_THROW("'" + name_ + "': cannot read " + path + ": " + first_line(e.what()));
  }
}

std::vector<std::string> Pt2Archive::programs() const {
  std::vector<std::string> out;
  for (const auto& path : reader_->getAllRecords()) {
    if (path.rfind(kModelsFolder, 0) == 0 && ends_with(path, ".json"))
      out.push_back(path.substr(std::strlen(kModelsFolder), path.size() - std::strlen(kModelsFolder) - 5));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Pt2Archive::has_program(const std::string& program) const { return has_record(kModelsFolder + program + ".json"); }

Json Pt2Archive::program(const std::string& program) const {
  const std::string path = kModelsFolder + program + ".json";
  try {
    return Json::parse(record(path));
  } catch (const Json::exception& e) {
    MPIDDP_THROW("'" + name_ + "': " + path + " is not JSON: " + first_line(e.what()));
  }
}

StoredTensors Pt2Archive::stored(const std::string& folder, const std::string& config) const {
  StoredTensors out;
  if (!has_record(config)) return out;
  std::map<std::string, torch::Tensor> storages;  // by blob
  std::map<std::string, torch::Tensor> views;     // by blob and tensor_meta: tied weights, one tensor
  try {
    const auto entries = Json::parse(record(config)).at("config");
    for (const auto& [tensor_name, entry] : entries.items()) {
      const std::string where = "'" + name_ + "': " + folder + " '" + tensor_name + "'";
      MPIDDP_CHECK(!entry.value("use_pickle", false),
                   where + " is pickled (a tensor subclass or an object), which mpiddp cannot train");
      StoredTensor t;
      t.blob = entry.at("path_name").get<std::string>();
      t.is_param = entry.value("is_param", false);
      const auto& meta = entry.at("tensor_meta");
      t.requires_grad = meta.value("requires_grad", false);
      auto& storage = storages[t.blob];
      if (!storage.defined()) storage = storage_of(record(folder + t.blob));
      auto& view = views[t.blob + " " + meta.dump()];
      if (!view.defined()) view = tensor_in_blob(storage, meta, where);
      t.tensor = view;
      out.emplace_back(tensor_name, std::move(t));
    }
  } catch (const Json::exception& e) {
    MPIDDP_THROW("'" + name_ + "': " + config + " is not what a .pt2 archive holds: " + first_line(e.what()));
  }
  return out;
}

StoredTensors Pt2Archive::weights(const std::string& program) const {
  return stored(kWeightsFolder, kWeightsFolder + program + "_weights_config.json");
}
StoredTensors Pt2Archive::constants(const std::string& program) const {
  return stored(kConstantsFolder, kConstantsFolder + program + "_constants_config.json");
}

std::string Pt2Archive::with_weights(const std::map<std::string, torch::Tensor>& values) const {
  // Each blob again at its stored size, its tensors' trained values written through the stored
  // views: every program's (an eval program's weights are blobs of their own, by the same names).
  std::map<std::string, torch::Tensor> blobs;
  StoredTensors all;
  for (const auto& program : programs()) {
    auto more = weights(program);
    all.insert(all.end(), more.begin(), more.end());
  }
  for (const auto& [tensor_name, stored] : all) {
    auto it = values.find(tensor_name);
    MPIDDP_CHECK(it != values.end(), "no trained value for the archive's weight '" + tensor_name + "'");
    MPIDDP_CHECK(it->second.sizes() == stored.tensor.sizes(), "the trained '" + tensor_name + "' is " +
                                                                  shape_text(it->second.sizes()) + ", the archive's " +
                                                                  shape_text(stored.tensor.sizes()));
    torch::NoGradGuard no_grad;
    stored.tensor.copy_(it->second.detach().to(torch::kCPU));  // into the blob's storage, at its view
    blobs[stored.blob] = stored.tensor;
  }
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const auto& path : reader_->getAllRecords()) {
    if (std::find(kWriterOwnRecords.begin(), kWriterOwnRecords.end(), path) != kWriterOwnRecords.end()) continue;
    auto blob = path.rfind(kWeightsFolder, 0) == 0 ? blobs.find(path.substr(std::strlen(kWeightsFolder))) : blobs.end();
    if (blob != blobs.end()) {
      const auto& storage = blob->second.storage();
      writer.writeRecord(path, storage.data(), storage.nbytes());
    } else {
      const auto bytes = record(path);
      writer.writeRecord(path, bytes.data(), bytes.size());
    }
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace mpiddp::detail

#endif  // MPIDDP_HAS_PT2
