// The safetensors format (see safetensors.hpp). Tensor bytes are copied as they lie in memory: the
// hosts mpiddp runs on (x86-64, aarch64) are little-endian, as the format is.
#include "io/safetensors.hpp"

#include <mpiddp/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

namespace mpiddp {

// Named, as well as anonymous: a unity build compiles this file in one unit with others whose
// anonymous namespaces have their own Dtype and dtype_of.
namespace safetensors_format {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the safetensors library's own limit
constexpr const char* kMetadataKey = "__metadata__";

// A dtype's name in the format and its torch type, in the safetensors library's order of dtypes
// reversed: its writer lays out tensors in this order (then by name), so the widest come first and
// every tensor starts aligned to its element.
struct Dtype {
  const char* name;
  c10::ScalarType type;
};
constexpr std::array<Dtype, 10> kDtypes = {{{"I64", c10::kLong},
                                            {"F64", c10::kDouble},
                                            {"F32", c10::kFloat},
                                            {"I32", c10::kInt},
                                            {"BF16", c10::kBFloat16},
                                            {"F16", c10::kHalf},
                                            {"I16", c10::kShort},
                                            {"I8", c10::kChar},
                                            {"U8", c10::kByte},
                                            {"BOOL", c10::kBool}}};

const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const Dtype* dtype_of(c10::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// ---- writing ----

std::string padded_header(const std::vector<std::tuple<std::string, torch::Tensor, const Dtype*>>& items,
                          const std::map<std::string, std::string>& metadata) {
  // The library's key order: the metadata first, then the tensors as their data lies.
  auto header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t, dtype] : items) {
    const auto bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = nlohmann::ordered_json{
        {"dtype", dtype->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-aligned
  return text;
}

void write_file(const std::string& path, const std::string& header,
                const std::vector<std::tuple<std::string, torch::Tensor, const Dtype*>>& items) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  std::array<char, 8> length{};
  for (size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out.write(length.data(), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& item : items) {
    const auto& t = std::get<1>(item);
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  }
  out.close();
  std::error_code ec;
  if (out.fail()) {
    std::filesystem::remove(tmp, ec);
    MPIDDP_THROW("cannot write safetensors file '" + path + "'");
  }
  std::filesystem::rename(tmp, path, ec);
  MPIDDP_CHECK(!ec, "cannot write safetensors file '" + path + "': " + ec.message());
}

// ---- reading ----

// One tensor's header entry, checked on its own.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  SafetensorsFile read() {
    if (!std::filesystem::is_regular_file(path_)) fault("does not exist");
    in_.open(path_, std::ios::binary);
    if (!in_) fault("cannot be opened");
    const uint64_t file_bytes = std::filesystem::file_size(path_);
    if (file_bytes < 8) fault("is " + std::to_string(file_bytes) + " bytes, shorter than the 8-byte header length");
    const uint64_t header_bytes = read_length();
    if (header_bytes > file_bytes - 8) {
      fault("its header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
            std::to_string(file_bytes) + " bytes)");
    }
    if (header_bytes > kMaxHeaderBytes) {
      fault("its header length " + std::to_string(header_bytes) + " is beyond the format's limit of " +
            std::to_string(kMaxHeaderBytes) + " bytes");
    }
    data_start_ = 8 + header_bytes;
    const json header = parse_header(read_text(header_bytes));
    SafetensorsFile file;
    std::vector<Entry> entries;
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        file.metadata = metadata_of(value);
      } else {
        entries.push_back(entry_of(key, value));
      }
    }
    check_layout(entries, file_bytes - data_start_);
    for (const auto& e : entries) file.tensors[e.name] = read_tensor(e);
    return file;
  }

 private:
  [[noreturn]] void fault(const std::string& what) const { MPIDDP_THROW("safetensors file '" + path_ + "' " + what); }

  uint64_t read_length() {
    std::array<unsigned char, 8> b{};
    in_.read(reinterpret_cast<char*>(b.data()), 8);
    uint64_t n = 0;
    for (size_t i = 0; i < 8; ++i) n |= static_cast<uint64_t>(b[i]) << (8 * i);
    return n;
  }

  std::string read_text(uint64_t bytes) {
    std::string text(bytes, '\0');
    in_.read(text.data(), static_cast<std::streamsize>(bytes));
    if (!in_) fault("cannot be read");
    return text;
  }

  // nlohmann keeps the last of two equal keys silently: the parser's callback sees every key of
  // every object, so a name given twice is caught (the format's own reader refuses it too).
  json parse_header(const std::string& text) const {
    std::vector<std::set<std::string>> open_objects;
    std::string duplicate;
    const json::parser_callback_t note_keys = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) open_objects.emplace_back();
      if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
      if (event == json::parse_event_t::key && !open_objects.empty() &&
          !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    const json header = json::parse(text, note_keys, /*allow_exceptions=*/false);
    if (header.is_discarded()) fault("has a header that is not JSON");
    if (!header.is_object()) fault("has a header that is not a JSON object");
    if (!duplicate.empty()) fault("names '" + duplicate + "' twice in its header");
    return header;
  }

  std::map<std::string, std::string> metadata_of(const json& value) const {
    if (!value.is_object()) fault("has a __metadata__ that is not an object");
    std::map<std::string, std::string> metadata;
    for (const auto& [key, text] : value.items()) {
      if (!text.is_string()) fault("has a __metadata__ value '" + key + "' that is not a string");
      metadata[key] = text.get<std::string>();
    }
    return metadata;
  }

  Entry entry_of(const std::string& name, const json& value) const {
    const auto bad = [&](const std::string& what) { fault("tensor '" + name + "': " + what); };
    if (!value.is_object()) bad("its entry is not an object");
    Entry e;
    e.name = name;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) bad("no dtype");
    e.dtype = dtype_named(dtype->get<std::string>());
    if (!e.dtype) bad("unknown dtype '" + dtype->get<std::string>() + "' (known: " + known_dtypes() + ")");
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) bad("no shape");
    uint64_t bytes = c10::elementSize(e.dtype->type);
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) bad("its shape " + shape->dump() + " is not a list of sizes >= 0");
      const auto size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (size > 0 && bytes > std::numeric_limits<uint64_t>::max() / size)) {
        bad("its shape " + shape->dump() + " is too large");
      }
      bytes *= size;
      e.shape.push_back(static_cast<int64_t>(size));
    }
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      bad("no data_offsets [BEGIN, END]");
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    if (e.end < e.begin) bad("its data_offsets " + offsets->dump() + " end before they begin");
    if (e.end - e.begin != bytes) {
      bad("its shape " + shape->dump() + " of " + dtype->get<std::string>() + " is " + std::to_string(bytes) +
          " bytes but its data_offsets " + offsets->dump() + " hold " + std::to_string(e.end - e.begin));
    }
    return e;
  }

  // The tensors tile the data exactly, as the format requires: in offset order each begins where
  // the previous one ended, the first at 0, and the last ends where the file does.
  void check_layout(std::vector<Entry>& entries, uint64_t data_bytes) const {
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    uint64_t covered = 0;
    std::string previous = "the data's start";
    for (const auto& e : entries) {
      if (e.begin < covered) fault("tensor '" + e.name + "' overlaps " + previous);
      if (e.begin > covered) {
        fault("leaves bytes [" + std::to_string(covered) + ", " + std::to_string(e.begin) +
              ") of its data to no tensor");
      }
      covered = e.end;
      previous = "tensor '" + e.name + "'";
    }
    if (covered != data_bytes) {
      fault("has " + std::to_string(data_bytes) + " bytes of data but its tensors' offsets cover " +
            std::to_string(covered));
    }
  }

  torch::Tensor read_tensor(const Entry& e) {
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
    in_.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
    in_.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in_) fault("tensor '" + e.name + "' cannot be read");
    return t;
  }

  std::string path_;
  std::ifstream in_;
  uint64_t data_start_ = 0;
};

void write(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
           const std::map<std::string, std::string>& metadata) {
  std::vector<std::tuple<std::string, torch::Tensor, const Dtype*>> items;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    MPIDDP_CHECK(name != kMetadataKey, "safetensors file '" + path + "': a tensor cannot be named __metadata__");
    MPIDDP_CHECK(names.insert(name).second, "safetensors file '" + path + "': tensor '" + name + "' given twice");
    const Dtype* dtype = dtype_of(t.scalar_type());
    MPIDDP_CHECK(dtype, "safetensors file '" + path + "': tensor '" + name + "' is of " +
                            std::string(c10::toString(t.scalar_type())) + ", not one of " + known_dtypes());
    items.emplace_back(name, t.detach().to(torch::kCPU).contiguous(), dtype);
  }
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return std::make_pair(std::get<2>(a) - kDtypes.data(), std::get<0>(a)) <
           std::make_pair(std::get<2>(b) - kDtypes.data(), std::get<0>(b));
  });
  write_file(path, padded_header(items, metadata), items);
}

}  // namespace
}  // namespace safetensors_format

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  safetensors_format::write(path, tensors, metadata);
}

SafetensorsFile read_safetensors(const std::string& path) { return safetensors_format::Reader(path).read(); }

}  // namespace mpiddp
