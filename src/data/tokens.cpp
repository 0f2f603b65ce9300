// llm.c token shards as one memory-mapped stream, and GPT windows over it (see tokens.hpp).
#include <mpiddp/error.hpp>
#include <mpiddp/tokens.hpp>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace mpiddp {

namespace {

bool has_wildcard(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Each source as files: a pattern expanded and sorted by name (byte order: shard numbers are
// zero-padded), a plain name as it is.
std::vector<std::string> expand(const std::vector<std::string>& sources) {
  std::vector<std::string> files;
  for (const auto& source : sources) {
    if (!has_wildcard(source)) {
      files.push_back(source);
      continue;
    }
    glob_t g{};
    const int rc = glob(source.c_str(), 0, nullptr, &g);
    std::vector<std::string> matched;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) matched.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    MPIDDP_CHECK(!matched.empty(), "token data: the pattern '" + source + "' matches no file");
    std::sort(matched.begin(), matched.end());
    files.insert(files.end(), matched.begin(), matched.end());
  }
  MPIDDP_CHECK(!files.empty(), "token data: no file given");
  return files;
}

int32_t header_int(const unsigned char* bytes, int i) {
  int32_t v;
  std::memcpy(&v, bytes + 4 * i, 4);  // little-endian, as llm.c writes it (and every host mpiddp runs on)
  return v;
}

}  // namespace

// A read-only memory mapping of one whole file.
struct TokenStream::Mapping {
  const unsigned char* bytes = nullptr;
  size_t size = 0;
  const unsigned char* body = nullptr;  ///< the first token (after the header, if any)

  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MPIDDP_CHECK(fd >= 0, "token shard '" + path +
                              "': " + (errno == ENOENT ? std::string("does not exist") : std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      MPIDDP_THROW("token shard '" + path + "' is not a regular file");
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      MPIDDP_CHECK(p != MAP_FAILED, "token shard '" + path + "': cannot map it: " + std::strerror(err));
      bytes = static_cast<const unsigned char*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (bytes) ::munmap(const_cast<unsigned char*>(bytes), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

TokenStream::TokenStream(const std::vector<std::string>& sources, TokenFormat format) {
  for (const auto& path : expand(sources)) {
    auto map = std::make_unique<Mapping>(path);
    TokenShard shard;
    shard.path = path;
    if (format == TokenFormat::kRawUint16) {
      MPIDDP_CHECK(map->size % 2 == 0,
                   "token file '" + path + "' (raw uint16) has an odd size of " + std::to_string(map->size) + " bytes");
      shard.tokens = static_cast<int64_t>(map->size / 2);
      map->body = map->bytes;
    } else {
      const auto header_bytes = static_cast<size_t>(kLlmcHeaderInts * 4);
      MPIDDP_CHECK(map->size >= header_bytes, "token shard '" + path + "' is " + std::to_string(map->size) +
                                                  " bytes, shorter than llm.c's 1024-byte header");
      const int32_t magic = header_int(map->bytes, 0), version = header_int(map->bytes, 1);
      if (magic == kLlmcMagicUint16) {
        MPIDDP_CHECK(version == kLlmcVersionUint16, "token shard '" + path + "': magic " + std::to_string(magic) +
                                                        " with version " + std::to_string(version) + " (expected 1)");
        shard.token_bytes = 2;
      } else if (magic == kLlmcMagicUint32) {
        MPIDDP_CHECK(version == kLlmcVersionUint32, "token shard '" + path + "': magic " + std::to_string(magic) +
                                                        " with version " + std::to_string(version) + " (expected 7)");
        shard.token_bytes = 4;
      } else {
        MPIDDP_THROW("token shard '" + path + "': bad magic " + std::to_string(magic) + " (llm.c shards start with " +
                     std::to_string(kLlmcMagicUint16) + ", or " + std::to_string(kLlmcMagicUint32) +
                     " for uint32 tokens; a headerless nanoGPT .bin needs --data-format raw-uint16)");
      }
      shard.tokens = header_int(map->bytes, 2);
      map->body = map->bytes + header_bytes;
      const size_t body = map->size - header_bytes;
      MPIDDP_CHECK(shard.tokens >= 0 && body == static_cast<size_t>(shard.tokens) * shard.token_bytes,
                   "token shard '" + path + "': its header says " + std::to_string(shard.tokens) + " tokens (" +
                       std::to_string(static_cast<int64_t>(shard.tokens) * shard.token_bytes) +
                       " bytes) but the file holds " + std::to_string(body) + " bytes after the header");
    }
    MPIDDP_CHECK(shard.tokens > 0, "token shard '" + path + "' holds no tokens");
    first_.push_back(total_);
    total_ += shard.tokens;
    shards_.push_back(shard);
    maps_.push_back(std::move(map));
  }
}

TokenStream::~TokenStream() = default;

torch::Tensor TokenStream::read(int64_t begin, int64_t count) const {
  MPIDDP_CHECK(begin >= 0 && count >= 0 && begin + count <= total_,
               "tokens [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") outside a stream of " +
                   std::to_string(total_));
  auto out = torch::empty({count}, torch::kLong);
  auto* dst = out.data_ptr<int64_t>();
  // The shard holding `begin`, then on through the following ones.
  size_t s = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), begin) - first_.begin()) - 1;
  for (int64_t done = 0; done < count; ++s) {
    const auto& shard = shards_[s];
    const int64_t from = begin + done - first_[s], n = std::min(count - done, shard.tokens - from);
    const unsigned char* body = maps_[s]->body;
    for (int64_t i = 0; i < n; ++i) {
      if (shard.token_bytes == 2) {
        uint16_t t;
        std::memcpy(&t, body + 2 * (from + i), 2);
        dst[done + i] = t;
      } else {
        uint32_t t;
        std::memcpy(&t, body + 4 * (from + i), 4);
        dst[done + i] = t;
      }
    }
    done += n;
  }
  return out;
}

void TokenStream::check_vocab(int64_t vocab_size) const {
  constexpr int64_t kChunk = int64_t{1} << 20;
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (int64_t at = 0; at < shards_[s].tokens; at += kChunk) {
      const auto part = read(first_[s] + at, std::min(kChunk, shards_[s].tokens - at));
      const auto bad = (part >= vocab_size).nonzero();
      if (bad.numel() == 0) continue;
      const int64_t i = bad[0][0].item<int64_t>();
      MPIDDP_THROW("token shard '" + shards_[s].path + "': token " + std::to_string(at + i) + " is " +
                   std::to_string(part[i].item<int64_t>()) + ", outside a vocabulary of " + std::to_string(vocab_size) +
                   " (--vocab-size)");
    }
  }
}

TokenWindows::TokenWindows(std::shared_ptr<const TokenStream> stream, int64_t block_size, std::string name)
    : stream_(std::move(stream)) {
  MPIDDP_CHECK(block_size > 0, "the block size must be > 0, got " + std::to_string(block_size));
  info_.path = !name.empty() ? std::move(name) : stream_->shards().front().path;
  info_.samples = (stream_->size() - 1) / block_size;
  info_.sample_shape = {block_size};
  info_.block_size = block_size;
  MPIDDP_CHECK(info_.samples > 0, "token data '" + info_.path + "' of " + std::to_string(stream_->size()) +
                                      " tokens holds no window of block size " + std::to_string(block_size) + " + 1");
}

Example TokenWindows::read(const std::vector<int64_t>& indices) const {
  const int64_t n = static_cast<int64_t>(indices.size()), block = info_.block_size;
  auto windows = torch::empty({n, block + 1}, torch::kLong);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = indices[static_cast<size_t>(r)];
    MPIDDP_CHECK(i >= 0 && i < size(), "window " + std::to_string(i) + " outside [0, " + std::to_string(size()) + ")");
    windows[r].copy_(stream_->read(i * block, block + 1));
  }
  return {windows.narrow(1, 0, block).contiguous(), windows.narrow(1, 1, block).contiguous()};
}

Example TokenWindows::read_range(int64_t begin, int64_t count) const {
  std::vector<int64_t> indices(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) indices[static_cast<size_t>(i)] = begin + i;
  return read(indices);
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version) {
  MPIDDP_CHECK(version == kLlmcVersionUint16 || version == kLlmcVersionUint32,
               "llm.c shards have version 1 (uint16) or 7 (uint32), not " + std::to_string(version));
  MPIDDP_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "a shard holds at most 2^31-1 tokens");
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = version == kLlmcVersionUint16 ? kLlmcMagicUint16 : kLlmcMagicUint32;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MPIDDP_CHECK(f.good(), "cannot write token shard '" + path + "'");
    f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
    if (version == kLlmcVersionUint16) {
      std::vector<uint16_t> narrow(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) {
        MPIDDP_CHECK(tokens[i] < 65536,
                     "token " + std::to_string(tokens[i]) + " does not fit a uint16 shard (version 1)");
        narrow[i] = static_cast<uint16_t>(tokens[i]);
      }
      f.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    MPIDDP_CHECK(f.good(), "cannot write token shard '" + path + "'");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace mpiddp
