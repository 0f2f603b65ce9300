// Token shards: files written here byte by byte as llm.c's dev/data scripts write them (not by
// mpiddp's writer) are read back as one stream, in name order across shards, as windows of T+1;
// every malformed shard is a one-line error naming the file; the writer's bytes equal the
// hand-made ones.
#include <mpiddp/error.hpp>
#include <mpiddp/tokens.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "error_of.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;
using mpiddp::testing::error_of;

namespace {

class TokenFiles : public mpiddp::testing::ScratchDir {
 protected:
  TokenFiles() : ScratchDir("tokens") {}

  // llm.c's layout: 256 int32 (magic, version, count, zeros), then the tokens.
  std::string shard(const std::string& name, const std::vector<uint32_t>& tokens, int32_t magic = 20240520,
                    int32_t version = 1, int64_t header_count = -1, int token_bytes = 2) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(header_count >= 0 ? header_count : static_cast<int64_t>(tokens.size()));
    const auto path = (dir / name).string();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    for (auto t : tokens) f.write(reinterpret_cast<const char*>(&t), token_bytes);  // little-endian host
    return path;
  }
};

std::vector<int64_t> values(const torch::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_F(TokenFiles, ShardsInNameOrderAreOneStream) {
  // Written out of order; the glob reads them in name order.
  shard("d_train_000002.bin", {7, 8, 9});
  shard("d_train_000001.bin", {1, 2, 3, 4});
  shard("d_train_000003.bin", {65535, 11});
  mpiddp::TokenStream s({(dir / "d_train_*.bin").string()});
  ASSERT_EQ(s.shards().size(), 3u);
  EXPECT_EQ(s.shards()[0].path, (dir / "d_train_000001.bin").string());
  EXPECT_EQ(s.size(), 9);
  EXPECT_EQ(values(s.read(0, 9)), (std::vector<int64_t>{1, 2, 3, 4, 7, 8, 9, 65535, 11}));
  EXPECT_EQ(values(s.read(3, 3)), (std::vector<int64_t>{4, 7, 8}));  // across a shard boundary
  EXPECT_EQ(error_of([&] { s.check_vocab(65536); }), "");
  EXPECT_EQ(error_of([&] { s.check_vocab(256); }),
            "token shard '" + (dir / "d_train_000003.bin").string() +
                "': token 0 is 65535, outside a vocabulary of 256 (--vocab-size)");
}

TEST_F(TokenFiles, WindowsOfBlockPlusOneAtStrideBlock) {
  std::vector<uint32_t> tokens(23);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 100 + i;
  auto stream = std::make_shared<mpiddp::TokenStream>(std::vector<std::string>{shard("w.bin", tokens)});
  mpiddp::TokenWindows w(stream, 5);
  EXPECT_EQ(w.size(), (23 - 1) / 5);  // window i holds tokens [5i, 5i + 5]
  const auto e = w.read({3, 0});
  ASSERT_EQ(e.inputs.sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(values(e.inputs[0]), (std::vector<int64_t>{115, 116, 117, 118, 119}));
  EXPECT_EQ(values(e.targets[0]), (std::vector<int64_t>{116, 117, 118, 119, 120}));
  EXPECT_EQ(values(e.inputs[1]), (std::vector<int64_t>{100, 101, 102, 103, 104}));
  EXPECT_EQ(values(e.targets[1]), (std::vector<int64_t>{101, 102, 103, 104, 105}));
  EXPECT_EQ(mpiddp::TokenWindows(stream, 22).size(), 1);
  EXPECT_NE(error_of([&] { mpiddp::TokenWindows(stream, 23); }).find("holds no window"), std::string::npos);
}

TEST_F(TokenFiles, Uint32AndRawUint16) {
  const auto wide = shard("llama.bin", {70000, 1, 128255}, 20240801, 7, -1, 4);
  EXPECT_EQ(values(mpiddp::TokenStream({wide}).read(0, 3)), (std::vector<int64_t>{70000, 1, 128255}));
  const auto raw = (dir / "train.bin").string();
  {
    std::ofstream f(raw, std::ios::binary);
    const uint16_t t[] = {5, 40000, 6};
    f.write(reinterpret_cast<const char*>(t), sizeof t);
  }
  EXPECT_EQ(values(mpiddp::TokenStream({raw}, mpiddp::TokenFormat::kRawUint16).read(0, 3)),
            (std::vector<int64_t>{5, 40000, 6}));
  // Never guessed: a headerless file read as llm.c's format is refused.
  EXPECT_NE(error_of([&] { mpiddp::TokenStream s({raw}); }).find("shorter than llm.c's 1024-byte header"),
            std::string::npos);
}

TEST_F(TokenFiles, MalformedShardsAreOneLineErrorsNamingTheFile) {
  const auto truncated = shard("truncated.bin", {1, 2, 3}, 20240520, 1, 5);
  const auto magic = shard("magic.bin", {1, 2}, 12345);
  const auto version = shard("version.bin", {1, 2}, 20240520, 7);
  const auto empty = shard("empty.bin", {});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {truncated, "its header says 5 tokens (10 bytes) but the file holds 6 bytes after the header"},
      {magic, "bad magic 12345"},
      {version, "magic 20240520 with version 7 (expected 1)"},
      {empty, "holds no tokens"},
      {(dir / "none.bin").string(), "does not exist"},
      {(dir / "nothing_*.bin").string(), "matches no file"},
  };
  for (const auto& [path, says] : cases) {
    const auto what = error_of([&] { mpiddp::TokenStream s({path}); });
    EXPECT_NE(what.find(says), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  const auto odd = (dir / "odd.bin").string();
  std::ofstream(odd, std::ios::binary) << "abc";
  EXPECT_NE(error_of([&] { mpiddp::TokenStream s({odd}, mpiddp::TokenFormat::kRawUint16); }).find("odd size"),
            std::string::npos);
}

TEST_F(TokenFiles, WriterBytesEqualLlmcLayout) {
  const std::vector<uint32_t> tokens = {0, 255, 1000, 65535};
  const auto hand = shard("hand.bin", tokens);
  const auto mine = (dir / "mine.bin").string();
  mpiddp::write_token_shard(mine, tokens);
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(bytes(mine), bytes(hand));
  EXPECT_NE(error_of([&] { mpiddp::write_token_shard(mine, {70000}); }).find("does not fit a uint16 shard"),
            std::string::npos);
  const auto wide = (dir / "wide.bin").string();
  mpiddp::write_token_shard(wide, {70000, 3}, mpiddp::kLlmcVersionUint32);
  EXPECT_EQ(bytes(wide), bytes(shard("wide_hand.bin", {70000, 3}, 20240801, 7, -1, 4)));
}
