// Snapshot I/O against a plain parallel write of the same bytes (bench/snapshot_bench.sh).
// Every rank holds an even share of P float32 elements in T tensors (a GPT-sized trainer state:
// parameters and Adam's two moments); per repetition, on the same file system:
//   snapshot write  write_parallel_snapshot: one HDF5 file, each rank its hyperslabs (MPI-IO,
//                   collective), CRCs, the layout header, fsync, rename: what a training run pays
//   snapshot read   SnapshotReader: verification (every byte's CRC, an even share per rank) and
//                   every rank reading its own share of every tensor
//   MPI-IO write    MPI_File_write_at_all of each rank's share of the same bytes, contiguous, fsync
//   MPI-IO read     MPI_File_read_at_all of the same
// Prints one JSON line per repetition and kind: {"kind", "ranks", "bytes", "seconds"}.
// usage: mpiddp_snapshot_io DIR [MILLION_ELEMENTS=32.5] [TENSORS=228] [REPS=3] [through-rank-0]
#include <mpiddp/runtime.hpp>

#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "snapshot/parallel_snapshot.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void report(const char* kind, int ranks, int64_t bytes, double seconds) {
  std::printf("{\"kind\": \"%s\", \"ranks\": %d, \"bytes\": %lld, \"seconds\": %.6f}\n", kind, ranks,
              static_cast<long long>(bytes), seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  mpiddp::Runtime runtime(&argc, &argv);
  const MPI_Comm comm = runtime.world();
  const int rank = runtime.rank(), size = runtime.size();
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: %s DIR [MILLION_ELEMENTS] [TENSORS] [REPS] [through-rank-0]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto elements = static_cast<int64_t>((argc > 2 ? std::stod(argv[2]) : 32.5) * 1e6);
  const int tensors = argc > 3 ? std::stoi(argv[3]) : 228;
  const int reps = argc > 4 ? std::stoi(argv[4]) : 3;
  const auto io = argc > 5 && std::string(argv[5]) == "through-rank-0" ? mpiddp::detail::SnapshotIo::kThroughRankZero
                                                                       : mpiddp::detail::SnapshotIo::kParallel;
  torch::manual_seed(1);
  std::vector<torch::Tensor> whole;
  for (int t = 0; t < tensors; ++t) whole.push_back(torch::rand({elements / tensors}));
  const int64_t bytes = static_cast<int64_t>(whole.size()) * (elements / tensors) * 4;
  std::vector<mpiddp::detail::TensorPart> parts;
  for (int t = 0; t < tensors; ++t) parts.push_back(mpiddp::detail::even_share("t/" + std::to_string(t), whole[t], rank, size));
  mpiddp::Snapshot meta;
  meta.ints["world_size"] = size;

  const std::string snap = dir + "/bench-snapshot.h5", raw = dir + "/bench-raw.bin";
  for (int rep = 0; rep < reps; ++rep) {
    MPI_Barrier(comm);
    double t0 = now();
    mpiddp::detail::write_parallel_snapshot(comm, snap, parts, meta, io);
    MPI_Barrier(comm);
    if (rank == 0) report("snapshot write", size, bytes, now() - t0);

    t0 = now();
    {
      mpiddp::detail::SnapshotReader reader(comm, snap, io);
      for (const auto& p : parts) {
        auto out = torch::empty({p.part.numel()});
        reader.read(p.name, p.first, out);
      }
      reader.verdict();
    }
    MPI_Barrier(comm);
    if (rank == 0) report("snapshot read", size, bytes, now() - t0);

    // The same bytes, each rank's share contiguous in one file: a collective write and read.
    std::vector<torch::Tensor> mine;
    int64_t my_bytes = 0;
    for (const auto& p : parts) mine.push_back(p.part), my_bytes += p.part.numel() * 4;
    int64_t offset = 0;
    MPI_Exscan(&my_bytes, &offset, 1, MPI_INT64_T, MPI_SUM, comm);
    if (rank == 0) offset = 0;
    MPI_Barrier(comm);
    t0 = now();
    MPI_File f;
    MPI_File_open(comm, raw.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &f);
    int64_t at = offset;
    for (const auto& t : mine) {  // one collective call per tensor, as HDF5 makes one per dataset
      MPI_File_write_at_all(f, at, t.data_ptr(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_STATUS_IGNORE);
      at += t.numel() * 4;
    }
    MPI_File_sync(f);
    MPI_File_close(&f);
    MPI_Barrier(comm);
    if (rank == 0) report("MPI-IO write", size, bytes, now() - t0);

    t0 = now();
    MPI_File_open(comm, raw.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &f);
    at = offset;
    for (const auto& t : mine) {
      auto out = torch::empty_like(t);
      MPI_File_read_at_all(f, at, out.data_ptr(), static_cast<int>(out.numel()), MPI_FLOAT, MPI_STATUS_IGNORE);
      at += t.numel() * 4;
    }
    MPI_File_close(&f);
    MPI_Barrier(comm);
    if (rank == 0) report("MPI-IO read", size, bytes, now() - t0);
  }
  if (rank == 0) {
    std::filesystem::remove(snap);
    std::filesystem::remove(raw);
  }
  return 0;
}
