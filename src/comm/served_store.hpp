// A c10d TCPStore that rank 0 serves on a port the kernel picks, its port sent to every rank by
// MPI: no MASTER_PORT to choose, so no port race. The gloo backend's rendezvous, and the store the
// workers of `mpiddp launch` join as torchrun's agent store.
#pragma once

#include <mpiddp/runtime.hpp>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>

namespace mpiddp::detail {

struct ServedStore {
  c10::intrusive_ptr<c10d::TCPStore> server;  ///< rank 0's (null elsewhere): keep it while clients use it
  int port = 0;                               ///< the same on every rank
};

/// Rank 0 opens the server (clients will name it `host`); every rank learns its port. Collective;
/// throws mpiddp::Error on every rank when rank 0 cannot open it.
ServedStore serve_store(const Runtime& runtime, const std::string& host, int clients, std::chrono::milliseconds timeout,
                        const std::string& what);

}  // namespace mpiddp::detail
