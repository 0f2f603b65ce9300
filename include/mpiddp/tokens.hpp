// Token data for language models: llm.c's token shards (and nanoGPT's headerless train.bin) read
// as one stream of tokens, and the windows of a block of tokens a GPT trains on.
//
// llm.c's shard format (dev/data/*.py write it, llmc/dataloader.h reads it): a header of 256
// little-endian int32, [0] the magic, [1] the version, [2] the number of tokens, then the tokens:
//   magic 20240520, version 1: uint16 tokens (GPT-2's vocabulary and byte-level ones)
//   magic 20240801, version 7: uint32 tokens (Llama 3's)
// nanoGPT's train.bin / val.bin are the tokens alone, uint16, no header: read only when asked for
// by name (TokenFormat::kRawUint16), never guessed. Every file is checked when it is opened (a
// header that disagrees with the file's size, a bad magic or version, an empty shard) and throws
// mpiddp::Error naming the file; check_vocab() names the first token outside a vocabulary.
#pragma once

#include <mpiddp/data.hpp>

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mpiddp {

enum class TokenFormat {
  kLlmc,       ///< llm.c shards: the header says version and token width
  kRawUint16,  ///< nanoGPT's headerless uint16 files
};

/// llm.c's magic numbers and versions.
constexpr int32_t kLlmcMagicUint16 = 20240520;
constexpr int32_t kLlmcVersionUint16 = 1;
constexpr int32_t kLlmcMagicUint32 = 20240801;
constexpr int32_t kLlmcVersionUint32 = 7;
constexpr int64_t kLlmcHeaderInts = 256;

struct TokenShard {
  std::string path;
  int64_t tokens = 0;
  int token_bytes = 2;  ///< 2 (uint16) or 4 (uint32)
};

/// Shard files as one stream of tokens, in the order given, each glob expanded in name order.
/// The files are memory-mapped read-only: a read touches only the pages it needs.
class TokenStream {
 public:
  /// `sources`: file names or glob patterns (data/fineweb_train_*.bin); a pattern that matches
  /// nothing, or a file that is missing or malformed, throws naming it.
  explicit TokenStream(const std::vector<std::string>& sources, TokenFormat format = TokenFormat::kLlmc);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  int64_t size() const { return total_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  /// Tokens [begin, begin + count) of the stream (across shard boundaries) as int64.
  torch::Tensor read(int64_t begin, int64_t count) const;
  /// Throws naming the shard, the token's position in it and its value for the first token
  /// >= vocab_size.
  void check_vocab(int64_t vocab_size) const;

 private:
  struct Mapping;
  std::vector<TokenShard> shards_;
  std::vector<std::unique_ptr<Mapping>> maps_;
  std::vector<int64_t> first_;  ///< each shard's first token's index in the stream
  int64_t total_ = 0;
};

/// The samples of a GPT: windows of T+1 tokens at stride T (T = block_size). Window i holds tokens
/// [iT, iT + T]: its input is the first T, its target the last T (the next token at each place).
/// As a SampleSet: info().block_size is T, classification over the vocabulary, check_labels()
/// checks every token of the stream.
class TokenWindows final : public SampleSet {
 public:
  /// `name` labels the set in messages (default: the first shard's path).
  TokenWindows(std::shared_ptr<const TokenStream> stream, int64_t block_size, std::string name = "");
  const DatasetInfo& info() const override { return info_; }
  int64_t block_size() const { return info_.block_size; }
  const TokenStream& stream() const { return *stream_; }
  /// The windows at `indices`, in that order: inputs and targets int64 [n, T].
  Example read(const std::vector<int64_t>& indices) const override;
  Example read_range(int64_t begin, int64_t count) const override;
  void check_labels(int64_t vocab_size) const override { stream_->check_vocab(vocab_size); }
  bool cached() const override { return true; }  ///< memory-mapped: a read is a copy

 private:
  std::shared_ptr<const TokenStream> stream_;
  DatasetInfo info_;
};

/// Writes `tokens` as one llm.c shard (version 1: uint16, every token < 65536; version 7: uint32).
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version = kLlmcVersionUint16);

}  // namespace mpiddp
