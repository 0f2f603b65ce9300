// safetensors (src/io/safetensors.hpp): every dtype round trips bitwise with the metadata; the
// writer's bytes are the format's, checked byte by byte (8-byte little-endian length, the library's
// order: widest dtype first, then by name, offsets tiling the data, the header padded with spaces
// to 8); every malformed file, written here by hand, is a one-line mpiddp::Error naming the file
// and its fault.
#include <mpiddp/error.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "error_of.hpp"
#include "io/safetensors.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;
using mpiddp::testing::error_of;

namespace {

class Safetensors : public mpiddp::testing::ScratchDir {
 protected:
  Safetensors() : ScratchDir("safetensors") {}

  std::string path(const std::string& name) const { return (dir / name).string(); }

  static std::string bytes_of(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // A file of `header` with `length` as its 8-byte length (default: the header's own) and `data`.
  std::string file_with(const std::string& header, const std::string& data, int64_t length = -1) const {
    const auto file = path("hand.safetensors");
    const uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
    return file;
  }

  // The reader's message for `file`, which must name the file, contain `fault` and be one line.
  void expect_refused(const std::string& file, const std::string& fault) const {
    const auto message = error_of([&] { mpiddp::read_safetensors(file); });
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(fault), std::string::npos) << "want '" << fault << "' in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
};

// A header entry: tensor `name` of `dtype` and `shape` at data bytes [begin, end).
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, int begin, int end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

}  // namespace

TEST_F(Safetensors, EveryDtypeRoundTripsBitwiseWithMetadata) {
  torch::manual_seed(3);
  const auto randn = [](torch::ScalarType type) { return torch::randn({3, 5}).to(type); };
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"f64", randn(torch::kDouble)},
      {"f32", randn(torch::kFloat)},
      {"f16", randn(torch::kHalf)},
      {"bf16", randn(torch::kBFloat16)},
      {"i64", torch::randint(-1000000, 1000000, {7}, torch::kLong)},
      {"i32", torch::randint(-100000, 100000, {2, 2, 2}, torch::kInt)},
      {"i16", torch::randint(-30000, 30000, {5}, torch::kShort)},
      {"i8", torch::randint(-128, 127, {9}, torch::kChar)},
      {"u8", torch::randint(0, 255, {11}, torch::kByte)},
      {"bool", torch::randint(0, 2, {13}).to(torch::kBool)},
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::zeros({0, 4})},
      {"transposed", torch::arange(6, torch::kFloat).view({2, 3}).t()},  // written contiguous
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode, \"quoted\""}};
  const auto file = path("all.safetensors");
  mpiddp::write_safetensors(file, tensors, metadata);
  const auto read = mpiddp::read_safetensors(file);
  EXPECT_EQ(read.metadata, metadata);
  ASSERT_EQ(read.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const auto& back = read.tensors.at(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
}

TEST_F(Safetensors, HeaderLayoutByteByByte) {
  const auto file = path("layout.safetensors");
  const auto b = torch::tensor({1.0F, 2.0F});
  const auto a = torch::tensor({3.0F});
  const auto h = torch::tensor({1, 2, 3}, torch::kHalf);
  const auto l = torch::tensor({int64_t{-5}}, torch::kLong);
  mpiddp::write_safetensors(file, {{"b", b}, {"h", h}, {"a", a}, {"l", l}}, {{"format", "pt"}});
  const auto bytes = bytes_of(file);
  // As the safetensors library writes it: the metadata first, then I64 before F32 before F16 and,
  // within a dtype, by name; offsets tile the data from 0.
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}," + entry("l", "I64", "[1]", 0, 8) + "," +
                       entry("a", "F32", "[1]", 8, 12) + "," + entry("b", "F32", "[2]", 12, 20) + "," +
                       entry("h", "F16", "[3]", 20, 26) + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0U);
  ASSERT_EQ(bytes.size(), 8 + header.size() + 26);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n, header.size()) << "little-endian uint64 length of the padded header";
  EXPECT_EQ(bytes.substr(8, header.size()), header);
  const auto data = bytes.substr(8 + header.size());
  const auto raw = [](const torch::Tensor& t) {
    return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel() * t.element_size()));
  };
  EXPECT_EQ(data, raw(l) + raw(a) + raw(b) + raw(h));
}

TEST_F(Safetensors, NoMetadataNoKeyAndNoTensorsIsAnEmptyObject) {
  const auto file = path("empty.safetensors");
  mpiddp::write_safetensors(file, {});
  EXPECT_EQ(bytes_of(file), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  const auto read = mpiddp::read_safetensors(file);
  EXPECT_TRUE(read.tensors.empty());
  EXPECT_TRUE(read.metadata.empty());
}

TEST_F(Safetensors, WriterRefusesDuplicatesAndUnsupportedDtypes) {
  const auto file = path("w.safetensors");
  EXPECT_NE(error_of([&] {
              mpiddp::write_safetensors(file, {{"x", torch::ones(1)}, {"x", torch::ones(1)}});
            }).find("tensor 'x' given twice"),
            std::string::npos);
  const auto complex = torch::ones({2}, torch::kComplexFloat);
  EXPECT_NE(error_of([&] {
              mpiddp::write_safetensors(file, {{"z", complex}});
            }).find("'z' is of ComplexFloat"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(Safetensors, MalformedFilesAreOneLineErrors) {
  const std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
  const auto a = [](const std::string& shape, int begin, int end, const std::string& dtype = "F32") {
    return entry("a", dtype, shape, begin, end);
  };
  expect_refused(path("missing.safetensors"), "does not exist");
  expect_refused(file_with("", "abc", 0), "has a header that is not JSON");
  {
    const auto file = path("short.safetensors");
    std::ofstream(file, std::ios::binary) << "abc";
    expect_refused(file, "is 3 bytes, shorter than the 8-byte header length");
  }
  expect_refused(file_with("{}", "", 1000), "its header length 1000 runs past the end of the file (10 bytes)");
  expect_refused(file_with("{\"a\": ", four), "has a header that is not JSON");
  expect_refused(file_with("[1, 2]", ""), "has a header that is not a JSON object");
  expect_refused(file_with("{" + a("[1]", 0, 4) + "," + a("[1]", 4, 8) + "}", eight), "names 'a' twice");
  expect_refused(file_with("{" + a("[1]", 0, 4, "F8_E4M3") + "}", four), "tensor 'a': unknown dtype 'F8_E4M3'");
  expect_refused(file_with("{" + a("[3]", 0, 8) + "}", eight),
                 "tensor 'a': its shape [3] of F32 is 12 bytes but its data_offsets [0,8] hold 8");
  expect_refused(file_with("{" + a("[-1]", 0, 4) + "}", four), "is not a list of sizes >= 0");
  expect_refused(file_with("{" + a("[0]", 4, 0) + "}", ""), "end before they begin");
  expect_refused(file_with("{" + a("[100]", 0, 400) + "}", four),
                 "has 4 bytes of data but its tensors' offsets cover 400");
  expect_refused(file_with("{" + a("[1]", 0, 4) + "}", eight), "has 8 bytes of data but its tensors' offsets cover 4");
  expect_refused(file_with("{" + a("[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", twelve),
                 "tensor 'b' overlaps tensor 'a'");
  expect_refused(file_with("{" + a("[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}", twelve),
                 "leaves bytes [4, 8) of its data to no tensor");
  expect_refused(file_with("{" + a("[1]", 4, 8) + "}", eight), "leaves bytes [0, 4) of its data to no tensor");
  expect_refused(file_with("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", four), "tensor 'a': no dtype");
  expect_refused(file_with("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", four), "tensor 'a': no data_offsets");
  expect_refused(file_with("{\"__metadata__\":{\"k\":1}}", ""), "__metadata__ value 'k' that is not a string");
}
