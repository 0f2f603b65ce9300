#include "comm/served_store.hpp"

#include <mpiddp/compat.hpp>
#include <mpiddp/error.hpp>

#include "common/check.hpp"

namespace mpiddp::detail {

ServedStore serve_store(const Runtime& runtime, const std::string& host, int clients, std::chrono::milliseconds timeout,
                        const std::string& what) {
  ServedStore s;
  std::string server_error;
  if (runtime.rank() == 0) {
    c10d::TCPStoreOptions so;
    so.timeout = timeout;
    compat::use_classic_tcp_store(so);
    so.port = 0;
    so.isServer = true;
    so.numWorkers = clients;
    so.waitWorkers = false;
    try {
      s.server = c10::make_intrusive<c10d::TCPStore>(host, so);
      s.port = s.server->getPort();
    } catch (const std::exception& e) {
      s.port = -1;  // tells every rank, so all fail together instead of waiting for a store
      server_error = e.what();
    }
  }
  s.port = static_cast<int>(broadcast_int64(runtime.world(), s.port));
  MPIDDP_CHECK(s.port > 0, what + ": rank 0 could not open its TCPStore" +
                               (server_error.empty() ? std::string() : ": " + server_error));
  return s;
}

}  // namespace mpiddp::detail
