#include "snapshot/parallel_snapshot.hpp"

#include <mpiddp/config.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>
#include <mpiddp/runtime.hpp>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/check.hpp"
#include "common/check_hdf5.hpp"
#include "common/even_share.hpp"
#include "common/host.hpp"
#include "common/text.hpp"
#include "runtime/agreement.hpp"

namespace mpiddp::detail {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// The most bytes one MPI message or one verification read carries.
constexpr int64_t kPieceBytes = int64_t{16} << 20;

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

// A part's elements in host memory: the tensor itself when it lives there (no copy).
torch::Tensor host_bytes(const torch::Tensor& t) {
  return t.defined() ? t.detach().to(torch::kCPU).contiguous() : torch::Tensor();
}

// Sends or receives `bytes` bytes at `data` in pieces MPI's int counts can carry, each piece a
// wait of `step` (within the communication timeout).
void send_bytes(const void* data, int64_t bytes, int to, MPI_Comm comm, CollectiveStep& step) {
  for (int64_t off = 0; off < bytes; off += kPieceBytes) {
    MPI_Request rq;
    MPIDDP_CHECK_MPI(MPI_Isend(static_cast<const char*>(data) + off,
                               static_cast<int>(std::min(kPieceBytes, bytes - off)), MPI_BYTE, to, 0, comm, &rq));
    step.wait(rq);
  }
}
void receive_bytes(void* data, int64_t bytes, int from, MPI_Comm comm, CollectiveStep& step) {
  for (int64_t off = 0; off < bytes; off += kPieceBytes) {
    MPI_Request rq;
    MPIDDP_CHECK_MPI(MPI_Irecv(static_cast<char*>(data) + off, static_cast<int>(std::min(kPieceBytes, bytes - off)),
                               MPI_BYTE, from, 0, comm, &rq));
    step.wait(rq);
  }
}

std::vector<uint32_t> allgather_crcs(MPI_Comm comm, const std::vector<uint32_t>& mine) {
  const auto all = allgather_int64(comm, std::vector<int64_t>(mine.begin(), mine.end()));
  return std::vector<uint32_t>(all.begin(), all.end());
}

// Reals travel as their bit patterns (JSON has no NaN or Inf).
json meta_to_json(const Snapshot& s) {
  std::map<std::string, uint64_t> reals;
  for (const auto& [k, v] : s.reals) std::memcpy(&reals[k], &v, sizeof v);
  return {{"ints", s.ints}, {"reals", reals}, {"texts", s.texts}};
}
void meta_from_json(const json& j, Snapshot& s) {
  s.ints = j.at("ints").get<std::map<std::string, int64_t>>();
  for (const auto& [k, bits] : j.at("reals").get<std::map<std::string, uint64_t>>())
    std::memcpy(&s.reals[k], &bits, sizeof bits);
  s.texts = j.at("texts").get<std::map<std::string, std::string>>();
}

// Rank 0's `j` on every rank (text that is not UTF-8 arrives with U+FFFD in its place: dump()
// must not throw on rank 0 alone).
json broadcast_json(MPI_Comm comm, const json& j) {
  std::string text = rank_of(comm) == 0 ? j.dump(-1, ' ', false, json::error_handler_t::replace) : std::string();
  broadcast_string(comm, text);
  return json::parse(text);
}

// Every rank's extent of every tensor; checks that the ranks declare the same tensors and that
// each tensor's parts tile it. Returns, per tensor, the ranks' (first, numel) in rank order.
std::vector<std::vector<std::pair<int64_t, int64_t>>> gather_extents(MPI_Comm comm,
                                                                     const std::vector<TensorPart>& tensors) {
  const int n = size_of(comm);
  std::string schema;
  for (const auto& t : tensors) {
    schema += t.name + ' ' + dtype_of(t.dtype).name;
    for (auto d : t.shape) schema += ' ' + std::to_string(d);
    schema += '\n';
  }
  const auto all = allgather_int64(
      comm, {static_cast<int64_t>(crc_of(schema.data(), schema.size())), static_cast<int64_t>(tensors.size())});
  for (int r = 1; r < n; ++r) {
    MPIDDP_CHECK(all[2 * r] == all[0] && all[2 * r + 1] == all[1],
                 "rank " + std::to_string(r) +
                     " declares other tensors than rank 0 (a model or optimizer that "
                     "differs between ranks)");
  }
  std::vector<int64_t> local;
  for (const auto& t : tensors) local.push_back(t.first), local.push_back(t.part.defined() ? t.part.numel() : 0);
  const auto every = allgather_int64(comm, local);
  for (const auto& t : tensors) {  // after the collectives: the caller agrees on a local error
    MPIDDP_CHECK(!t.part.defined() || t.part.scalar_type() == t.dtype, "this rank's part of '" + t.name + "' is " +
                                                                           c10::toString(t.part.scalar_type()) +
                                                                           ", declared " + c10::toString(t.dtype));
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> extents(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    int64_t numel = 1;
    for (auto d : tensors[k].shape) numel *= d;
    std::vector<std::pair<int64_t, int64_t>> parts;
    for (int r = 0; r < n; ++r)
      parts.emplace_back(every[local.size() * r + 2 * k], every[local.size() * r + 2 * k + 1]);
    auto sorted = parts;
    std::sort(sorted.begin(), sorted.end());
    int64_t next = 0;
    for (const auto& [first, count] : sorted) {
      if (count == 0) continue;
      MPIDDP_CHECK(first == next, "the ranks' parts of '" + tensors[k].name + "' do not tile it");
      next += count;
    }
    MPIDDP_CHECK(next == numel, "the ranks' parts of '" + tensors[k].name + "' do not cover it");
    extents[k] = std::move(parts);
  }
  return extents;
}

// The dataset's CRC-32 from its parts' (extents and CRCs per rank), combined in element order.
int64_t combined_crc(const std::vector<std::pair<int64_t, int64_t>>& extents, const std::vector<uint32_t>& crcs,
                     size_t element_size) {
  std::vector<size_t> order(extents.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return extents[a].first < extents[b].first; });
  uint32_t crc = crc_of(nullptr, 0);
  for (size_t r : order) {
    if (extents[r].second > 0) crc = crc_combine(crc, crcs[r], extents[r].second * static_cast<int64_t>(element_size));
  }
  return crc;
}

hid_t space_of(const std::vector<int64_t>& shape) {
  if (shape.empty()) return H5Screate(H5S_SCALAR);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
}

Hid file_access(MPI_Comm comm, SnapshotIo io) {
  Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  // HDF5 1.10's format: its metadata carries checksums of its own, so damage there is refused.
  MPIDDP_CHECK_HDF5(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110));
#if MPIDDP_HDF5_PARALLEL
  if (io == SnapshotIo::kParallel) MPIDDP_CHECK_HDF5(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
#else
  (void)comm;
  MPIDDP_CHECK(io == SnapshotIo::kThroughRankZero, "this mpiddp's HDF5 is not parallel");
#endif
  return fapl;
}

// HDF5 calls that, through MPI-IO, wait for every rank (creating, writing, closing the file): a
// watchdog's deadline while they last, the way out if a rank never comes (runtime.hpp).
std::optional<BlockingCall> watched(SnapshotIo io, const std::string& what) {
  if (io != SnapshotIo::kParallel) return std::nullopt;
  return std::optional<BlockingCall>(std::in_place, what + " (HDF5 MPI-IO)");
}

// Closing a file opened through MPI-IO is collective: while an exception unwinds this rank alone
// (a timeout), the other ranks may be in a collective it will never join, so the file is left open
// (the job is ending: MPI_Abort or MPI_Finalize ends it), as H5Dataset does.
void leave_open_while_unwinding(SnapshotIo io, Hid& file) {
  if (io == SnapshotIo::kParallel && std::uncaught_exceptions() > 0) file.release();
}

Hid transfer(SnapshotIo io, bool collective) {
  Hid dxpl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
#if MPIDDP_HDF5_PARALLEL
  if (io == SnapshotIo::kParallel) {
    MPIDDP_CHECK_HDF5(H5Pset_dxpl_mpio(dxpl.get(), collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT));
  }
#else
  (void)io, (void)collective;
#endif
  return dxpl;
}

// Writes elements [first, first + count) of `dataset` from `data` (count 0: takes part with none).
void write_range(hid_t dataset, const DtypeInfo& dt, const std::vector<int64_t>& shape, int64_t first, int64_t count,
                 const void* data, hid_t dxpl) {
  Hid file_space(MPIDDP_CHECK_HDF5(H5Dget_space(dataset)), H5Sclose);
  select_flat_range(file_space.get(), shape, first, count);
  const hsize_t n = static_cast<hsize_t>(std::max<int64_t>(count, 1));
  Hid memory(MPIDDP_CHECK_HDF5(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  if (count == 0) MPIDDP_CHECK_HDF5(H5Sselect_none(memory.get()));
  static const char none = 0;
  MPIDDP_CHECK_HDF5(H5Dwrite(dataset, dt.mem_type, memory.get(), file_space.get(), dxpl, count ? data : &none));
}

void read_range(hid_t dataset, const DtypeInfo& dt, const std::vector<int64_t>& shape, int64_t first, int64_t count,
                void* data, hid_t dxpl) {
  Hid file_space(MPIDDP_CHECK_HDF5(H5Dget_space(dataset)), H5Sclose);
  select_flat_range(file_space.get(), shape, first, count);
  const hsize_t n = static_cast<hsize_t>(std::max<int64_t>(count, 1));
  Hid memory(MPIDDP_CHECK_HDF5(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  if (count == 0) MPIDDP_CHECK_HDF5(H5Sselect_none(memory.get()));
  char none = 0;
  MPIDDP_CHECK_HDF5(H5Dread(dataset, dt.mem_type, memory.get(), file_space.get(), dxpl, count ? data : &none));
}

// Refuses a write the file system has no room for, before any rank starts it.
void check_room(const fs::path& dir, int64_t data_bytes, size_t datasets) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return;  // unknown: the write itself will say
  const auto free_bytes = static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
  // HDF5's own metadata: about 1 KiB per dataset and a few KiB more.
  const int64_t need = data_bytes + static_cast<int64_t>(datasets) * 1024 + (int64_t{64} << 10);
  MPIDDP_CHECK(need <= free_bytes, "no room on the file system of '" + dir.string() + "': the snapshot needs " +
                                       std::to_string(need >> 20) + " MiB, " + std::to_string(free_bytes >> 20) +
                                       " MiB are free");
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  MPIDDP_CHECK(fd >= 0, "cannot open '" + path + "' to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MPIDDP_CHECK(rc == 0, "fsync of '" + path + "' failed: " + std::strerror(err));
}

// Rank 0, once every rank's part is in: the header (the file's layout and the CRC-32 of HDF5's
// structure, read back: metadata only, not the data) over the user block, the file synced,
// renamed over `path`, the directory synced.
void seal(const std::string& tmp, const std::string& path, const fs::path& dir, Layout layout) {
  layout.file_bytes = fs::file_size(tmp);
  std::sort(layout.raw.begin(), layout.raw.end());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  MPIDDP_CHECK(fd >= 0, "cannot open '" + tmp + "': " + std::strerror(errno));
  int err = 0;
  try {
    layout.structure_crc = structure_crc(layout, [&](uint64_t at, uint64_t n, char* into) {
      MPIDDP_CHECK(::pread(fd, into, n, static_cast<off_t>(at)) == static_cast<ssize_t>(n),
                   "cannot read back '" + tmp + "': " + std::strerror(errno));
    });
  } catch (...) {
    ::close(fd);
    throw;
  }
  const std::string block = layout_block(layout);
  if (::pwrite(fd, block.data(), block.size(), 0) != static_cast<ssize_t>(block.size())) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  MPIDDP_CHECK(err == 0, "cannot write the header of '" + tmp + "': " + std::strerror(err));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  MPIDDP_CHECK(!ec, "cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
}

}  // namespace

SnapshotIo resolve_io(SnapshotIo io, int64_t bytes) {
  if (io != SnapshotIo::kAuto) return io;
  return MPIDDP_HDF5_PARALLEL && bytes >= kParallelIoFromBytes ? SnapshotIo::kParallel : SnapshotIo::kThroughRankZero;
}

void check_shared_directory(MPI_Comm comm, const std::string& dir) {
  const int rank = rank_of(comm);
  std::string token, probe;
  LocalFailure f;
  if (rank == 0) {
    f.run([&] {
      token = local_hostname() + " " + std::to_string(::getpid()) + " " + std::to_string(unix_seconds());
      probe = (fs::path(dir) / (".mpiddp-shared-" + std::to_string(::getpid()))).string();
      std::ofstream out(probe);
      out << token;
      out.close();
      MPIDDP_CHECK(out.good(), "cannot write '" + probe + "': " + std::strerror(errno));
    });
  }
  throw_agreed_failure(comm, f);
  broadcast_string(comm, token);
  broadcast_string(comm, probe);
  if (rank != 0) {
    std::ifstream in(probe);
    const std::string seen((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (seen != token) {
      f.note("snapshot directory '" + dir + "' is not shared: rank " + std::to_string(rank) + " on " +
             local_hostname() +
             " does not see what rank 0 writes there (snapshots are one file written by every rank: put them on "
             "a file system every node mounts, not a node-local one such as /tmp)");
    }
  }
  all_ok(comm, true);  // every rank has looked before the probe goes
  if (rank == 0) {
    std::error_code ignored;
    fs::remove(probe, ignored);
  }
  throw_agreed_failure(comm, f);
}

TensorPart even_share(const std::string& name, const torch::Tensor& whole, int rank, int size) {
  const auto flat = whole.detach().reshape(-1);
  const Share mine = share_of(flat.numel(), rank, size);
  return {name, whole.scalar_type(), whole.sizes().vec(), mine.first, flat.narrow(0, mine.first, mine.count)};
}

TensorPart owned_by(int owner, int rank, const std::string& name, const torch::Tensor& whole) {
  return {name, whole.scalar_type(), whole.sizes().vec(), 0, rank == owner ? whole : torch::Tensor()};
}

namespace {

// The bytes of the tensors whole: the same on every rank, as the tensors are declared alike
// (gather_extents checks it).
int64_t declared_bytes(const std::vector<TensorPart>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    bytes += numel * static_cast<int64_t>(c10::elementSize(t.dtype));
  }
  return bytes;
}

// The property lists every dataset of a snapshot is created and written with.
struct DatasetProperties {
  Hid lcpl, dcpl, dxpl;
};
DatasetProperties dataset_properties(SnapshotIo io) {
  DatasetProperties p;
  p.lcpl = Hid(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_create_intermediate_group(p.lcpl.get(), 1));
  p.dcpl = Hid(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  MPIDDP_CHECK_HDF5(H5Pset_fill_time(p.dcpl.get(), H5D_FILL_TIME_NEVER));  // every byte is written once
  p.dxpl = transfer(io, true);
  return p;
}

// Creates tensor `t`'s dataset in `file` as `dataset` (set before its dtype attribute is written:
// a rank whose attribute failed still takes its part in the dataset's collective write).
void create_dataset(Hid& dataset, hid_t file, const TensorPart& t, const DtypeInfo& dt, const DatasetProperties& p) {
  Hid space(MPIDDP_CHECK_HDF5(space_of(t.shape)), H5Sclose);
  dataset = Hid(MPIDDP_CHECK_HDF5(H5Dcreate2(file, t.name.c_str(), dt.file_type, space.get(), p.lcpl.get(),
                                             p.dcpl.get(), H5P_DEFAULT)),
                H5Dclose);
  write_text_attr(dataset.get(), kDtypeAttr, dt.name);
}

// One write_parallel_snapshot on this rank, as its phases in order. Every phase is called by every
// rank. Parallel HDF5: every metadata call (create, attributes, flush, close) is collective and
// made in the same order on every rank, whatever the others' outcome. A failure after the file is
// created is kept (failure_) and the rank goes on through every collective call; the ranks agree on
// it before rank 0 seals the file.
class ParallelWrite {
 public:
  ParallelWrite(MPI_Comm comm, const std::string& path, const std::vector<TensorPart>& tensors, SnapshotIo io)
      : comm_(comm), rank_(rank_of(comm)), n_(size_of(comm)), tensors_(tensors), path_(path) {
    const fs::path target(path);
    dir_ = target.has_parent_path() ? target.parent_path() : fs::path(".");
    tmp_ = (dir_ / ("." + target.filename().string() + ".tmp")).string();
    context_ = "cannot write snapshot '" + path + "': ";
    bytes_ = declared_bytes(tensors);
    io_ = resolve_io(io, bytes_);
    writes_ = io_ == SnapshotIo::kParallel || rank_ == 0;
    layout_.header_bytes = layout_header_bytes(tensors.size());
  }
  // A rank unwinding alone leaves the file open (leave_open_while_unwinding).
  ~ParallelWrite() { leave_open_while_unwinding(io_, file_); }
  ParallelWrite(const ParallelWrite&) = delete;
  ParallelWrite& operator=(const ParallelWrite&) = delete;

  // What every rank must agree on before a byte is written: the tensors, their parts, the room.
  void agree_on_declarations(const Snapshot& meta) {
    LocalFailure f;
    f.run([&] {
      meta_from_json(broadcast_json(comm_, meta_to_json(meta)), attrs_);
      extents_ = gather_extents(comm_, tensors_);
    });
    if (rank_ == 0) f.run([&] { check_room(dir_, bytes_, tensors_.size()); });
    throw_agreed_failure(comm_, f, context_);
  }

  // The temporary file, created by every rank that writes (collectively through MPI-IO); agreed.
  void create_file() {
    failure_.run([&] {
      if (!writes_) return;
      Hid fcpl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
      MPIDDP_CHECK_HDF5(H5Pset_userblock(fcpl.get(), layout_.header_bytes));
      const auto watch = watched(io_, "creation of snapshot file '" + tmp_ + "'");  // file_access's too
      Hid fapl = file_access(comm_, io_);
      const hid_t id = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
      MPIDDP_CHECK(id >= 0, "cannot create '" + tmp_ + "': " + hdf5_error_text());
      file_ = Hid(id, H5Fclose);
    });
    throw_agreed_failure(comm_, failure_, context_);
  }

  // The datasets and their bytes: every rank its part (or rank 0 everyone's, received in turn),
  // one tensor at a time in declaration order.
  void write_datasets() {
    part_crcs_.assign(tensors_.size(), 0);
    DatasetProperties props;
    failure_.run([&] { props = dataset_properties(io_); });
    CollectiveStep through_rank_zero(comm_, "snapshot write (parts sent to rank 0)");  // waits unless kParallel
    for (size_t k = 0; k < tensors_.size(); ++k) write_tensor(k, props, through_rank_zero);
  }

  // Each dataset's CRC-32 from its parts' (all-gathered), with its dtype and shape.
  std::map<std::string, DatasetEntry> manifest() const {
    const auto every = allgather_crcs(comm_, part_crcs_);
    std::map<std::string, DatasetEntry> out;
    for (size_t k = 0; k < tensors_.size(); ++k) {
      std::vector<uint32_t> crcs;
      for (int r = 0; r < n_; ++r) crcs.push_back(every[part_crcs_.size() * r + k]);
      const auto& t = tensors_[k];
      out[t.name] = {&dtype_of(t.dtype), t.shape, combined_crc(extents_[k], crcs, c10::elementSize(t.dtype))};
    }
    return out;
  }

  // The datasets' CRCs and the root's attributes and checksum, then the file flushed and closed.
  void finish_file(const std::map<std::string, DatasetEntry>& manifest) {
    if (!writes_) return;
    const auto watch = watched(io_, "closing snapshot file '" + tmp_ + "'");
    failure_.run([&] { write_catalog(manifest); });
    // Flushed (MPI_File_sync) and closed collectively, each call made by every rank whatever the
    // other's outcome: every rank's bytes are in.
    failure_.run([&] { MPIDDP_CHECK_HDF5(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL)); });
    failure_.run([&] { MPIDDP_CHECK_HDF5(H5Fclose(file_.release())); });
  }

  // Every rank's verdict on the writing, then rank 0 seals the file (seal()) and every rank learns
  // whether it could. On any failure the temporary file goes, and every rank throws the same error.
  void seal_or_discard() {
    try {
      throw_agreed_failure(comm_, failure_, context_);
      LocalFailure sealed;
      if (rank_ == 0) sealed.run([&] { seal(tmp_, path_, dir_, layout_); });
      throw_agreed_failure(comm_, sealed, context_);
    } catch (const Error&) {
      {
        const auto watch = watched(io_, "closing snapshot file '" + tmp_ + "' after an error");
        file_ = Hid();
      }
      if (rank_ == 0) {
        std::error_code ignored;
        fs::remove(tmp_, ignored);
      }
      throw;
    }
  }

 private:
  // Tensor k: this rank's part's CRC, its dataset created (every writing rank), its bytes written.
  void write_tensor(size_t k, const DatasetProperties& props, CollectiveStep& through_rank_zero) {
    const auto& t = tensors_[k];
    const auto& dt = dtype_of(t.dtype);
    const auto host = host_bytes(t.part);
    const int64_t count = host.defined() ? host.numel() : 0;
    part_crcs_[k] = count ? crc_of(host.data_ptr(), static_cast<size_t>(host.nbytes())) : crc_of(nullptr, 0);
    const auto watch = watched(io_, "snapshot write of '" + t.name + "'");
    Hid dataset;
    if (writes_) failure_.run([&] { create_dataset(dataset, file_.get(), t, dt, props); });
    if (io_ == SnapshotIo::kParallel) {
      failure_.run([&] {
        write_range(dataset.get(), dt, t.shape, t.first, count, host.defined() ? host.data_ptr() : nullptr,
                    props.dxpl.get());
      });
      return;
    }
    if (rank_ != 0) {
      if (count) send_bytes(host.data_ptr(), host.nbytes(), 0, comm_, through_rank_zero);
      return;
    }
    write_every_part(k, host, dataset.get(), props.dxpl.get(), through_rank_zero);
  }

  // Rank 0 without MPI-IO: every rank's part of tensor k in rank order, its own from `host`, the
  // others' received from them.
  void write_every_part(size_t k, const torch::Tensor& host, hid_t dataset, hid_t dxpl, CollectiveStep& step) {
    const auto& t = tensors_[k];
    const auto& dt = dtype_of(t.dtype);
    for (int r = 0; r < n_; ++r) {
      const auto [first, numel] = extents_[k][static_cast<size_t>(r)];
      if (numel == 0) continue;
      torch::Tensor bytes = host;
      if (r != 0) {
        bytes = torch::empty({numel}, torch::TensorOptions().dtype(t.dtype));
        receive_bytes(bytes.data_ptr(), bytes.nbytes(), r, comm_, step);
      }
      failure_.run([&] { write_range(dataset, dt, t.shape, first, numel, bytes.data_ptr(), dxpl); });
    }
  }

  // Each dataset's CRC attribute (and where its bytes lie, for the layout), then the root's
  // attributes and the manifest's checksum.
  void write_catalog(const std::map<std::string, DatasetEntry>& manifest) {
    for (const auto& [name, d] : manifest) {
      Hid dataset(MPIDDP_CHECK_HDF5(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
      write_scalar_attr(dataset.get(), kCrcAttr, H5T_NATIVE_INT64, &d.crc);
      const haddr_t at = H5Dget_offset(dataset.get());  // where its data lies (none: empty)
      const hsize_t bytes = H5Dget_storage_size(dataset.get());
      if (at != HADDR_UNDEF && bytes > 0) layout_.raw.emplace_back(at, bytes);
    }
    write_text_attr(file_.get(), "format", kSnapshotFormat);
    write_scalar_attr(file_.get(), "format_version", H5T_NATIVE_INT64, &kParallelFormat);
    for (const auto& [name, v] : attrs_.ints) write_scalar_attr(file_.get(), name, H5T_NATIVE_INT64, &v);
    for (const auto& [name, v] : attrs_.reals) write_scalar_attr(file_.get(), name, H5T_NATIVE_DOUBLE, &v);
    for (const auto& [name, v] : attrs_.texts) write_text_attr(file_.get(), name, v);
    const int64_t checksum = manifest_checksum(manifest, attrs_);
    write_scalar_attr(file_.get(), kChecksumAttr, H5T_NATIVE_INT64, &checksum);
  }

  MPI_Comm comm_;
  int rank_, n_;
  const std::vector<TensorPart>& tensors_;
  std::string path_, tmp_, context_;
  fs::path dir_;
  int64_t bytes_ = 0;
  SnapshotIo io_ = SnapshotIo::kAuto;
  bool writes_ = false;                                            ///< this rank opens the file
  Snapshot attrs_;                                                 ///< rank 0's meta, on every rank
  std::vector<std::vector<std::pair<int64_t, int64_t>>> extents_;  ///< gather_extents()
  Layout layout_;
  Hid file_;
  LocalFailure failure_;
  std::vector<uint32_t> part_crcs_;
};

}  // namespace

void write_parallel_snapshot(MPI_Comm comm, const std::string& path, const std::vector<TensorPart>& tensors,
                             const Snapshot& meta, SnapshotIo io) {
  quiet_hdf5();
  ParallelWrite write(comm, path, tensors, io);
  write.agree_on_declarations(meta);
  write.create_file();
  write.write_datasets();
  write.finish_file(write.manifest());
  write.seal_or_discard();
}

// ---- reading -----------------------------------------------------------------------------------

struct SnapshotReader::File {
  SnapshotIo io;
  Hid file;
  Hid dxpl;
  explicit File(SnapshotIo io) : io(io) {}
  ~File() { leave_open_while_unwinding(io, file); }
};

namespace {

json catalog_to_json(const Catalog& c) {
  json datasets = json::object();
  for (const auto& [name, d] : c.datasets)
    datasets[name] = {{"dtype", d.dtype->name}, {"shape", d.shape}, {"crc", d.crc}};
  return {{"meta", meta_to_json(c.meta)}, {"datasets", datasets}};
}

void catalog_from_json(const json& j, Snapshot& meta, std::map<std::string, DatasetEntry>& datasets) {
  meta_from_json(j.at("meta"), meta);
  for (const auto& [name, d] : j.at("datasets").items()) {
    datasets[name] = {dtype_named(d.at("dtype").get<std::string>()), d.at("shape").get<std::vector<int64_t>>(),
                      d.at("crc").get<int64_t>()};
  }
}

// Rank 0's look at the file: its format (1, 2 or 3), after checking a format-3 file's layout
// (header, size, the CRC-32 of HDF5's structure) so that HDF5 never parses damaged structure.
int64_t format_of(const std::string& path) {
  MPIDDP_CHECK(fs::exists(path), "snapshot '" + path + "' does not exist");
  const auto size = fs::file_size(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MPIDDP_CHECK(fd >= 0, "cannot open '" + path + "': " + std::strerror(errno));
  auto read = [&](uint64_t at, uint64_t n, char* into) {
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd, into + done, n - done, static_cast<off_t>(at + done));
      MPIDDP_CHECK(got > 0 || (got < 0 && errno == EINTR), "cannot read '" + path + "'");
      if (got > 0) done += static_cast<uint64_t>(got);
    }
  };
  int64_t format = kWholeFileFormat;  // unless shown otherwise: its reader says what is wrong
  try {
    std::string first(std::min<uintmax_t>(size, kUserBlock), '\0');
    read(0, first.size(), first.data());
    if (first.compare(0, sizeof kHdf5Signature - 1, kHdf5Signature) == 0) format = 1;
    if (layout_header_size(first) > 0) {
      verify_layout(path, size, read);
      format = kParallelFormat;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return format;
}

// What every rank learns of the file before any opens it: its format and size, from rank 0's look
// (format_of), once every rank has shown that it sees the file (a node-local --resume path would
// not). Collective; a failure is agreed.
std::pair<int64_t, int64_t> agree_on_file(MPI_Comm comm, const std::string& path) {
  const int rank = rank_of(comm);
  int64_t format = 0;
  LocalFailure f;
  if (rank == 0) f.run([&] { format = format_of(path); });
  LocalFailure seen;
  seen.run([&] {
    MPIDDP_CHECK(fs::exists(path), "snapshot '" + path + "' does not exist on rank " + std::to_string(rank) + " (" +
                                       local_hostname() + ")");
  });
  if (!f.failed()) f = seen;
  throw_agreed_failure(comm, f);
  int64_t size = 0;
  if (rank == 0) size = static_cast<int64_t>(fs::file_size(path));
  const auto zero = allgather_int64(comm, {format, size});  // rank 0's, first
  return {zero[0], zero[1]};
}

}  // namespace

SnapshotReader::SnapshotReader(MPI_Comm comm, const std::string& path, SnapshotIo io)
    : comm_(comm), path_(path), io_(io) {
  quiet_hdf5();
  const auto [format, bytes] = agree_on_file(comm, path);
  io_ = resolve_io(io, bytes);
  if (format != kParallelFormat) {
    load_whole_file();
    return;
  }
  open_catalog();
  verify_datasets();
}

// One writer's file (formats 1, 2): rank 0 reads it, every rank parses its bytes. Collective; agreed.
void SnapshotReader::load_whole_file() {
  std::vector<char> image;
  LocalFailure f;
  if (rank_of(comm_) == 0) f.run([&] { image = read_file_bytes(path_); });
  throw_agreed_failure(comm_, f);
  broadcast_bytes(comm_, image);
  LocalFailure parsed;
  parsed.run([&] { whole_ = std::make_unique<Snapshot>(read_snapshot_image(image, path_)); });
  throw_agreed_failure(comm_, parsed);
  meta_ = *whole_;
  meta_.tensors.clear();
  for (const auto& [name, t] : whole_->tensors) datasets_[name] = {&dtype_of(t.scalar_type()), t.sizes().vec(), -1};
}

// Format 3: the file opened (by every rank through MPI-IO, else by rank 0 alone), its catalog read
// and checked against the manifest's checksum by rank 0, then broadcast. Collective; agreed.
void SnapshotReader::open_catalog() {
  const int rank = rank_of(comm_);
  file_ = std::make_unique<File>(io_);
  json catalog;
  LocalFailure f;
  if (io_ == SnapshotIo::kParallel || rank == 0) {
    f.run([&] {
      const auto watch = watched(io_, "opening snapshot '" + path_ + "'");  // file_access's too
      Hid fapl = file_access(comm_, io_);
      const hid_t id = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
      MPIDDP_CHECK(id >= 0, "snapshot '" + path_ +
                                "' is not a readable HDF5 file (truncated or damaged: " + hdf5_error_text() + ")");
      file_->file = Hid(id, H5Fclose);
      file_->dxpl = transfer(io_, false);  // independent reads: a rank's failure holds no other rank
    });
  }
  if (rank == 0) {
    f.run([&] {
      Catalog c = read_catalog(file_->file.get(), path_);
      MPIDDP_CHECK(static_cast<int64_t>(manifest_checksum(c.datasets, c.meta)) == c.stored_checksum,
                   "snapshot '" + path_ + "' is corrupt: its checksum does not match its contents");
      catalog = catalog_to_json(c);
    });
  }
  throw_agreed_failure(comm_, f);
  catalog_from_json(broadcast_json(comm_, catalog), meta_, datasets_);
}

// Every dataset's bytes against its CRC-32: each rank reads its even share (crc_of_share), the
// ranks' CRCs are all-gathered and combined in element order. Collective; agreed.
void SnapshotReader::verify_datasets() {
  const int n = size_of(comm_);
  std::vector<uint32_t> crcs;
  for (const auto& [name, d] : datasets_) crcs.push_back(crc_of_share(name, d));
  const auto every = allgather_crcs(comm_, crcs);
  size_t k = 0;
  for (const auto& [name, d] : datasets_) {
    std::vector<std::pair<int64_t, int64_t>> extents;
    std::vector<uint32_t> parts;
    for (int r = 0; r < n; ++r) {
      const Share share = share_of(d.numel(), r, n);
      extents.emplace_back(share.first, share.count);
      parts.push_back(every[crcs.size() * r + k]);
    }
    if (!failed_.failed() && combined_crc(extents, parts, c10::elementSize(d.dtype->type)) != d.crc) {
      failed_.note("snapshot '" + path_ + "' is corrupt: the CRC-32 of dataset /" + name +
                   " does not match the one stored with it");
    }
    ++k;
  }
  verdict();
}

// The CRC-32 of this rank's even share of dataset `name`, read in pieces of at most kPieceBytes.
// Every rank makes the same number of reads (each one collective without MPI-IO).
uint32_t SnapshotReader::crc_of_share(const std::string& name, const DatasetEntry& d) {
  const int n = size_of(comm_);
  const int64_t numel = d.numel();
  const Share mine = share_of(numel, rank_of(comm_), n);
  const int64_t lo = mine.first, hi = mine.end();
  const int64_t piece = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(c10::elementSize(d.dtype->type)));
  const int64_t pieces = (numel / n + 1 + piece - 1) / piece;  // the same count on every rank
  uint32_t crc = crc_of(nullptr, 0);
  torch::Tensor buffer = torch::empty({std::min(piece, std::max<int64_t>(hi - lo, 0))}, d.dtype->type);
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t a = std::min(hi, lo + i * piece), b = std::min(hi, a + piece);
    auto out = buffer.narrow(0, 0, b - a);
    read(name, a, out);
    crc = crc_update(crc, out.data_ptr(), static_cast<size_t>(out.nbytes()));
  }
  return crc;
}

SnapshotReader::~SnapshotReader() {
  if (!file_) return;
  const auto watch = watched(io_, "closing a snapshot");
  file_.reset();
}

const DatasetEntry* SnapshotReader::find(const std::string& name) const {
  const auto it = datasets_.find(name);
  return it == datasets_.end() ? nullptr : &it->second;
}

void SnapshotReader::read(const std::string& name, int64_t first, torch::Tensor& out) {
  const auto* d = find(name);
  int64_t count = out.defined() ? out.numel() : 0;
  if (!d || (count > 0 && !(out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == d->dtype->type &&
                            first >= 0 && first + count <= d->numel()))) {
    failed_.note("snapshot '" + path_ + "': a read of " + name + " outside the file, or into the wrong kind of tensor");
    count = 0;  // this rank reads nothing, but still takes its part in the collective below
  }
  failed_.run([&] {
    if (whole_) {
      if (count) out.copy_(whole_->tensors.at(name).reshape(-1).narrow(0, first, count));
    } else if (io_ == SnapshotIo::kParallel) {
      if (count) {
        read_range(open_dataset(name).get(), *d->dtype, d->shape, first, count, out.data_ptr(), file_->dxpl.get());
      }
    } else {
      read_through_rank_zero(name, d, first, count, out);
    }
  });
}

detail::Hid SnapshotReader::open_dataset(const std::string& name) const {
  return Hid(MPIDDP_CHECK_HDF5(H5Dopen2(file_->file.get(), name.c_str(), H5P_DEFAULT)), H5Dclose);
}

// Rank 0 reads every rank's range and sends it: a failed read still sends (verdict() tells).
void SnapshotReader::read_through_rank_zero(const std::string& name, const DatasetEntry* d, int64_t first,
                                            int64_t count, torch::Tensor& out) {
  const int rank = rank_of(comm_), n = size_of(comm_);
  const auto all = allgather_int64(comm_, {first, count});
  CollectiveStep step(comm_, "snapshot read of " + name + " (parts sent by rank 0)");
  if (rank != 0) {
    if (count) receive_bytes(out.data_ptr(), out.nbytes(), 0, comm_, step);
    return;
  }
  std::string error;
  for (int r = 0; r < n; ++r) {
    const int64_t numel = all[2 * r + 1];
    if (numel == 0) continue;
    auto buffer = r == 0 ? out : torch::empty({numel}, torch::TensorOptions().dtype(d ? d->dtype->type : torch::kByte));
    try {
      MPIDDP_CHECK(d, "snapshot '" + path_ + "' has no tensor " + name);
      read_range(open_dataset(name).get(), *d->dtype, d->shape, all[2 * r], numel, buffer.data_ptr(),
                 file_->dxpl.get());
    } catch (const Error& e) {
      if (error.empty()) error = e.message();
    }
    if (r != 0) send_bytes(buffer.data_ptr(), buffer.nbytes(), r, comm_, step);
  }
  MPIDDP_CHECK(error.empty(), error);
}

void SnapshotReader::verdict() {
  const LocalFailure mine = std::exchange(failed_, LocalFailure());
  throw_agreed_failure(comm_, mine);
}

torch::Tensor SnapshotReader::read_whole(const std::string& name) {
  const auto* d = find(name);
  if (!d) {          // every rank alike: the same catalog
    failed_.take();  // this reason replaces any earlier one
    failed_.note("snapshot '" + path_ + "' has no tensor " + name);
    verdict();
  }
  auto whole = torch::empty(d->shape, d->dtype->type);
  // An even share each, then all-gathered in place: the file is read once, not once per rank.
  const int rank = rank_of(comm_), n = size_of(comm_);
  const int64_t numel = whole.numel(), elem = static_cast<int64_t>(whole.element_size());
  if (numel * elem > INT_MAX) {  // beyond MPI's int counts: every rank reads all of it
    auto flat = whole.view(-1);
    read(name, 0, flat);
    return whole;
  }
  std::vector<int> counts(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const Share share = share_of(numel, r, n);
    offsets[r] = static_cast<int>(share.first * elem);
    counts[r] = static_cast<int>(share.end() * elem) - offsets[r];
  }
  const Share mine = share_of(numel, rank, n);
  auto share = whole.view(-1).narrow(0, mine.first, mine.count);
  read(name, mine.first, share);
  CollectiveStep step(comm_, "all-gather of snapshot tensor " + name);
  MPI_Request rq;
  MPIDDP_CHECK_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, whole.data_ptr(), counts.data(), offsets.data(), MPI_BYTE,
                                   comm_, &rq));
  step.wait(rq);
  return whole;
}

}  // namespace mpiddp::detail
