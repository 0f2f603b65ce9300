// SummaryWriter: TensorBoard event files. Each record is TFRecord-framed:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | event | uint32 masked CRC-32C of the event
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The events are protobuf messages
// (tensorboard.proto, compiled by Debian's protoc); the CRC-32C is Boost.CRC's.
#include <mpiddp/error.hpp>
#include <mpiddp/tensorboard.hpp>

#include <boost/crc.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/host.hpp"
#include "tensorboard.pb.h"

namespace mpiddp {

namespace {

// CRC-32C (Castagnoli): polynomial 0x1EDC6F41, reflected, initial and final XOR all ones.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

uint32_t masked_crc32c(const void* data, std::size_t size) {
  Crc32c crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

}  // namespace

struct SummaryWriter::Impl {
  std::string path;
  std::FILE* file = nullptr;
  std::string scratch;

  void write(const tensorboard::Event& event) {
    MPIDDP_CHECK(event.SerializeToString(&scratch), "cannot encode a TensorBoard event for '" + path + "'");
    char header[12];
    put_le(header, scratch.size(), 8);
    put_le(header + 8, masked_crc32c(header, 8), 4);
    char footer[4];
    put_le(footer, masked_crc32c(scratch.data(), scratch.size()), 4);
    const bool ok = std::fwrite(header, 1, sizeof header, file) == sizeof header &&
                    std::fwrite(scratch.data(), 1, scratch.size(), file) == scratch.size() &&
                    std::fwrite(footer, 1, sizeof footer, file) == sizeof footer && std::fflush(file) == 0;
    MPIDDP_CHECK(ok, "cannot write the TensorBoard event file '" + path + "': " + std::strerror(errno));
  }

  tensorboard::Event event(int64_t step) const {
    tensorboard::Event e;
    e.set_wall_time(detail::unix_seconds());
    e.set_step(step);
    return e;
  }
};

SummaryWriter::SummaryWriter(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MPIDDP_CHECK(!ec && std::filesystem::is_directory(dir),
               "cannot create the TensorBoard directory '" + dir + "'" + (ec ? ": " + ec.message() : ""));
  // A name no other writer uses: time, host and process, then the first free counter.
  const std::string stem = (std::filesystem::path(dir) /
                            ("events.out.tfevents." + std::to_string(static_cast<long long>(detail::unix_seconds())) +
                             "." + detail::local_hostname() + "." + std::to_string(getpid()) + "."))
                               .string();
  for (int n = 0; impl_->file == nullptr; ++n) {
    impl_->path = stem + std::to_string(n);
    impl_->file = std::fopen(impl_->path.c_str(), "wbx");  // x: never open an existing file
    MPIDDP_CHECK(impl_->file != nullptr || (errno == EEXIST && n < 1000),
                 "cannot create the TensorBoard event file '" + impl_->path + "': " + std::strerror(errno));
  }
  auto first = impl_->event(0);
  first.set_file_version("brain.Event:2");
  impl_->write(first);
}

SummaryWriter::~SummaryWriter() {
  if (impl_ && impl_->file) std::fclose(impl_->file);
}

const std::string& SummaryWriter::path() const { return impl_->path; }

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  auto e = impl_->event(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  impl_->write(e);
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  auto e = impl_->event(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
  impl_->write(e);
}

void SummaryWriter::add_session_start(int64_t step) {
  auto e = impl_->event(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  impl_->write(e);
}

}  // namespace mpiddp
