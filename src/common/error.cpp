#include <mpiddp/error.hpp>

#include <mpi.h>

#include <atomic>
#include <cstring>

#include "common/check.hpp"

namespace mpiddp {
namespace {

std::atomic<int> g_rank{-1};

// Paths in messages start at the project's own folders, not at the build machine's root.
std::string short_path(const char* file) {
  std::string path = file ? file : "?";
  for (const char* top : {"/src/", "/include/", "/tests/", "/examples/", "/bench/"}) {
    auto pos = path.rfind(top);
    if (pos != std::string::npos) return path.substr(pos + 1);
  }
  return path;
}

std::string format_error(const std::string& message, const std::string& file, int line, int rank) {
  std::string where = rank >= 0 ? "[rank " + std::to_string(rank) + "] " : std::string();
  return where + file + ":" + std::to_string(line) + ": " + message;
}

}  // namespace

Error::Error(const std::string& message, const char* file, int line) : Error(message, file, line, current_rank()) {}

Error::Error(const std::string& message, const char* file, int line, int rank)
    : std::runtime_error(format_error(message, short_path(file), line, rank)),
      message_(message),
      file_(short_path(file)),
      line_(line),
      rank_(rank) {}

int current_rank() noexcept { return g_rank.load(std::memory_order_relaxed); }
void set_current_rank(int rank) noexcept { g_rank.store(rank, std::memory_order_relaxed); }

namespace detail {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  throw Error(std::string(call) + " failed: " + mpi_error_text(code), file, line);
}

}  // namespace detail
}  // namespace mpiddp
