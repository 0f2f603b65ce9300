#include <mpiddp/config.hpp>
#include <mpiddp/data.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <hdf5.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <numeric>
#include <optional>

#include "common/check_hdf5.hpp"
#include "runtime/agreement.hpp"

namespace mpiddp {
namespace {

using detail::Hid;
using detail::quiet_hdf5;

std::vector<hsize_t> dims_of(hid_t space) {
  const int nd = MPIDDP_CHECK_HDF5(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  MPIDDP_CHECK_HDF5(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return dims;
}

enum class Kind { kFloat32, kUInt8, kInt64, kOther };

Kind kind_of(hid_t dataset) {
  Hid type(MPIDDP_CHECK_HDF5(H5Dget_type(dataset)), H5Tclose);
  const auto cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (cls == H5T_FLOAT && size == 4) return Kind::kFloat32;
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type.get()) == H5T_SGN_NONE) return Kind::kUInt8;
  if (cls == H5T_INTEGER && size == 8 && H5Tget_sign(type.get()) == H5T_SGN_2) return Kind::kInt64;
  return Kind::kOther;
}

}  // namespace

struct H5Dataset::Handles {
  Hid file, inputs, targets;
  Hid collective;  // dataset transfer list for collective MPI-IO reads (after open_parallel)
  std::vector<hsize_t> in_dims, tg_dims;
  torch::Tensor mem_inputs, mem_targets;  // the whole dataset, once cache() loaded it

  // Reads the (sorted, distinct) rows into a tensor of `dtype`, one hyperslab per run of
  // consecutive rows, in one H5Dread.
  torch::Tensor rows(hid_t dataset, const std::vector<hsize_t>& dims, const std::vector<int64_t>& sorted,
                     c10::ScalarType dtype, hid_t mem_type, hid_t xfer = H5P_DEFAULT) const {
    Hid space(MPIDDP_CHECK_HDF5(H5Dget_space(dataset)), H5Sclose);
    MPIDDP_CHECK_HDF5(H5Sselect_none(space.get()));
    std::vector<hsize_t> start(dims.size(), 0), count(dims);
    for (size_t i = 0; i < sorted.size();) {
      size_t j = i + 1;
      while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
      start[0] = static_cast<hsize_t>(sorted[i]);
      count[0] = static_cast<hsize_t>(j - i);
      MPIDDP_CHECK_HDF5(H5Sselect_hyperslab(space.get(), H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
      i = j;
    }
    std::vector<int64_t> shape(dims.begin(), dims.end());
    shape[0] = static_cast<int64_t>(sorted.size());
    auto out = torch::empty(shape, dtype);
    std::vector<hsize_t> mdims(dims);
    mdims[0] = static_cast<hsize_t>(sorted.size());
    Hid mspace(MPIDDP_CHECK_HDF5(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr)), H5Sclose);
    MPIDDP_CHECK_HDF5(H5Dread(dataset, mem_type, mspace.get(), space.get(), xfer, out.data_ptr()));
    return out;
  }
};

H5Dataset::H5Dataset(const std::string& path) : h_(std::make_unique<Handles>()) {
  quiet_hdf5();
  info_.path = path;
  MPIDDP_CHECK(std::filesystem::exists(path), "dataset file '" + path + "' does not exist");
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  MPIDDP_CHECK(f >= 0, "'" + path + "' is not a readable HDF5 file (" + detail::hdf5_error_text() + ")");
  h_->file = Hid(f, H5Fclose);
  for (const char* name : {"inputs", "targets"}) {
    MPIDDP_CHECK(H5Lexists(f, name, H5P_DEFAULT) > 0, "'" + path + "' has no dataset /" + name);
  }
  open_datasets();
  {
    Hid s(MPIDDP_CHECK_HDF5(H5Dget_space(h_->inputs.get())), H5Sclose);
    h_->in_dims = dims_of(s.get());
    Hid t(MPIDDP_CHECK_HDF5(H5Dget_space(h_->targets.get())), H5Sclose);
    h_->tg_dims = dims_of(t.get());
  }
  MPIDDP_CHECK(!h_->in_dims.empty(), "'" + path + "': /inputs is a scalar; it needs a first dimension of samples");
  const Kind in_kind = kind_of(h_->inputs.get()), tg_kind = kind_of(h_->targets.get());
  MPIDDP_CHECK(in_kind == Kind::kFloat32 || in_kind == Kind::kUInt8,
               "'" + path + "': /inputs must be float32 or uint8");
  info_.uint8_inputs = in_kind == Kind::kUInt8;
  info_.samples = static_cast<int64_t>(h_->in_dims[0]);
  info_.sample_shape.assign(h_->in_dims.begin() + 1, h_->in_dims.end());
  MPIDDP_CHECK(!h_->tg_dims.empty() && static_cast<int64_t>(h_->tg_dims[0]) == info_.samples,
               "'" + path + "': /inputs has " + std::to_string(info_.samples) + " samples but /targets has " +
                   (h_->tg_dims.empty() ? std::string("none") : std::to_string(h_->tg_dims[0])));
  MPIDDP_CHECK(info_.samples > 0, "'" + path + "' holds an empty dataset (0 samples)");
  if (tg_kind == Kind::kInt64 && h_->tg_dims.size() == 1) {
    info_.classification = true;
    MPIDDP_CHECK(H5Aexists(f, "num_classes") > 0, "'" + path + "': class targets need a num_classes attribute");
    Hid a(MPIDDP_CHECK_HDF5(H5Aopen(f, "num_classes", H5P_DEFAULT)), H5Aclose);
    MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_INT64, &info_.num_classes));
    MPIDDP_CHECK(info_.num_classes > 0, "'" + path + "': num_classes must be > 0");
  } else if (tg_kind == Kind::kFloat32 && h_->tg_dims.size() == 2) {
    info_.classification = false;
    info_.target_dim = static_cast<int64_t>(h_->tg_dims[1]);
  } else {
    MPIDDP_THROW("'" + path + "': /targets must be int64 [N] (classes) or float32 [N, k] (regression)");
  }
  if (info_.uint8_inputs && H5Aexists(h_->inputs.get(), "scale") > 0) {
    Hid a(MPIDDP_CHECK_HDF5(H5Aopen(h_->inputs.get(), "scale", H5P_DEFAULT)), H5Aclose);
    MPIDDP_CHECK_HDF5(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &info_.scale));
  }
}

H5Dataset::~H5Dataset() {
  // Closing a file opened through MPI-IO is collective. While an exception unwinds this rank alone
  // (a failed read), the other ranks may be inside a collective read this rank will never join, and
  // the close would wait for them forever: the handles are left open instead (the job is ending;
  // HDF5 closes them at MPI_Finalize when every rank gets there, MPI_Abort ends them otherwise).
  if (parallel() && std::uncaught_exceptions() > 0) {
    h_->collective.release();
    h_->inputs.release();
    h_->targets.release();
    h_->file.release();
  } else if (parallel()) {
    BlockingCall watch("closing '" + info_.path + "' (HDF5 MPI-IO)");
    h_.reset();
  }
}

void H5Dataset::open_datasets() {
  h_->inputs = Hid(MPIDDP_CHECK_HDF5(H5Dopen2(h_->file.get(), "inputs", H5P_DEFAULT)), H5Dclose);
  h_->targets = Hid(MPIDDP_CHECK_HDF5(H5Dopen2(h_->file.get(), "targets", H5P_DEFAULT)), H5Dclose);
}

bool H5Dataset::parallel() const { return h_->collective.get() >= 0; }

bool H5Dataset::open_parallel(MPI_Comm comm) {
#if MPIDDP_HDF5_PARALLEL
  if (cached() || parallel()) return parallel();
  // The file is closed first: HDF5 would share the open (POSIX) file rather than reopen it.
  h_->inputs = Hid();
  h_->targets = Hid();
  h_->file = Hid();
  detail::LocalFailure failure;
  failure.run([&] {
    // Collective from here on (H5Pset_fapl_mpio duplicates the communicator).
    BlockingCall watch("collective open of '" + info_.path + "' (HDF5 MPI-IO)");
    Hid fapl(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    MPIDDP_CHECK_HDF5(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
    const hid_t f = H5Fopen(info_.path.c_str(), H5F_ACC_RDONLY, fapl.get());
    MPIDDP_CHECK(f >= 0, "cannot reopen '" + info_.path + "' through MPI-IO (" + detail::hdf5_error_text() + ")");
    h_->file = Hid(f, H5Fclose);
    open_datasets();
    h_->collective = Hid(MPIDDP_CHECK_HDF5(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    MPIDDP_CHECK_HDF5(H5Pset_dxpl_mpio(h_->collective.get(), H5FD_MPIO_COLLECTIVE));
  });
  if (detail::any_rank_failed(comm, failure)) {  // every rank knows: all stop alike
    MPIDDP_THROW_AGREED(failure.failed() ? failure.reason()
                                         : "another rank could not reopen '" + info_.path + "' through MPI-IO");
  }
  return true;
#else
  (void)comm;
  return false;
#endif
}

Example H5Dataset::read(const std::vector<int64_t>& indices) const { return read_rows(indices, false); }

Example H5Dataset::read_collective(const std::vector<int64_t>& indices) const { return read_rows(indices, parallel()); }

Example H5Dataset::read_rows(const std::vector<int64_t>& indices, bool collective) const {
  MPIDDP_CHECK(!indices.empty(), "read of no samples");
  const hid_t xfer = collective ? h_->collective.get() : H5P_DEFAULT;
  if (cached()) {
    const auto [lo, hi] = std::minmax_element(indices.begin(), indices.end());
    MPIDDP_CHECK(*lo >= 0 && *hi < info_.samples,
                 "sample index out of range [0, " + std::to_string(info_.samples) + ")");
    auto order = torch::tensor(indices, torch::kLong);
    Example e{h_->mem_inputs.index_select(0, order), h_->mem_targets.index_select(0, order)};
    if (info_.uint8_inputs) e.inputs = e.inputs.to(torch::kFloat).mul_(info_.scale);
    return e;
  }
  std::vector<int64_t> sorted(indices);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  MPIDDP_CHECK(sorted.front() >= 0 && sorted.back() < info_.samples,
               "sample index out of range [0, " + std::to_string(info_.samples) + ")");
  // HDF5 returns selected rows in file order: read the distinct rows sorted, then gather.
  std::vector<int64_t> where(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    where[i] = std::lower_bound(sorted.begin(), sorted.end(), indices[i]) - sorted.begin();
  }
  auto order = torch::tensor(where, torch::kLong);
  std::optional<BlockingCall> watch;  // a collective read waits for every rank's
  if (collective)
    watch.emplace("collective read of " + std::to_string(sorted.size()) + " rows of '" + info_.path +
                  "' (HDF5 MPI-IO)");
  Example e;
  if (info_.uint8_inputs) {
    e.inputs = h_->rows(h_->inputs.get(), h_->in_dims, sorted, torch::kUInt8, H5T_NATIVE_UINT8, xfer)
                   .index_select(0, order)
                   .to(torch::kFloat)
                   .mul_(info_.scale);
  } else {
    e.inputs =
        h_->rows(h_->inputs.get(), h_->in_dims, sorted, torch::kFloat, H5T_NATIVE_FLOAT, xfer).index_select(0, order);
  }
  e.targets = info_.classification
                  ? h_->rows(h_->targets.get(), h_->tg_dims, sorted, torch::kLong, H5T_NATIVE_INT64, xfer)
                  : h_->rows(h_->targets.get(), h_->tg_dims, sorted, torch::kFloat, H5T_NATIVE_FLOAT, xfer);
  e.targets = e.targets.index_select(0, order);
  return e;
}

Example H5Dataset::read_range(int64_t begin, int64_t count) const {
  std::vector<int64_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), begin);
  return read(idx);
}

void H5Dataset::check_labels(int64_t num_classes) const {
  if (!info_.classification) return;
  constexpr int64_t kChunk = 65536;  // bounded memory for files of any size
  for (int64_t begin = 0; begin < info_.samples; begin += kChunk) {
    const int64_t n = std::min(kChunk, info_.samples - begin);
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), begin);
    auto labels = h_->rows(h_->targets.get(), h_->tg_dims, idx, torch::kLong, H5T_NATIVE_INT64);
    const int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    MPIDDP_CHECK(lo >= 0 && hi < num_classes, "'" + info_.path + "': labels range over [" + std::to_string(lo) + ", " +
                                                  std::to_string(hi) + "] but the model has " +
                                                  std::to_string(num_classes) + " classes");
  }
}

int64_t H5Dataset::stored_bytes() const {
  auto bytes = [](const std::vector<hsize_t>& dims, int64_t element) {
    int64_t n = element;
    for (auto d : dims) n *= static_cast<int64_t>(d);
    return n;
  };
  return bytes(h_->in_dims, info_.uint8_inputs ? 1 : 4) + bytes(h_->tg_dims, info_.classification ? 8 : 4);
}

bool H5Dataset::cache(int64_t max_bytes) {
  if (cached()) return true;
  if (stored_bytes() > max_bytes) return false;
  std::vector<int64_t> all(static_cast<size_t>(info_.samples));
  std::iota(all.begin(), all.end(), 0);
  h_->mem_inputs = info_.uint8_inputs ? h_->rows(h_->inputs.get(), h_->in_dims, all, torch::kUInt8, H5T_NATIVE_UINT8)
                                      : h_->rows(h_->inputs.get(), h_->in_dims, all, torch::kFloat, H5T_NATIVE_FLOAT);
  h_->mem_targets = info_.classification
                        ? h_->rows(h_->targets.get(), h_->tg_dims, all, torch::kLong, H5T_NATIVE_INT64)
                        : h_->rows(h_->targets.get(), h_->tg_dims, all, torch::kFloat, H5T_NATIVE_FLOAT);
  return true;
}

bool H5Dataset::cached() const { return h_->mem_inputs.defined(); }

void write_dataset(const std::string& path, const torch::Tensor& inputs, const torch::Tensor& targets, double scale,
                   int64_t num_classes, const std::string& source) {
  quiet_hdf5();
  MPIDDP_CHECK(inputs.dim() >= 1 && targets.dim() >= 1 && inputs.size(0) == targets.size(0),
               "write_dataset: inputs and targets need the same number of rows");
  MPIDDP_CHECK(inputs.scalar_type() == torch::kFloat || inputs.scalar_type() == torch::kUInt8,
               "write_dataset: inputs must be float32 or uint8");
  const bool classes = targets.scalar_type() == torch::kLong && targets.dim() == 1;
  MPIDDP_CHECK(classes || (targets.scalar_type() == torch::kFloat && targets.dim() == 2),
               "write_dataset: targets must be int64 [N] or float32 [N, k]");
  // Written beside the destination and renamed: readers never see half a file.
  const std::string tmp = path + ".tmp";
  Hid f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  MPIDDP_CHECK(f.get() >= 0, "cannot create '" + tmp + "' (" + detail::hdf5_error_text() + ")");
  auto write = [&](const char* name, const torch::Tensor& t, hid_t file_type, hid_t mem_type) {
    auto c = t.contiguous();
    std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
    Hid space(MPIDDP_CHECK_HDF5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
    // Contiguous: row reads are hyperslabs of one extent, MPI-IO reads them collectively, and there
    // is no chunk index whose damage could take HDF5 down (HDF5 2.x asserts on some damaged B-trees).
    Hid d(MPIDDP_CHECK_HDF5(H5Dcreate2(f.get(), name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
          H5Dclose);
    MPIDDP_CHECK_HDF5(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data_ptr()));
    return d;
  };
  auto string_attr = [](hid_t obj, const char* name, const std::string& value) {
    Hid type(MPIDDP_CHECK_HDF5(H5Tcopy(H5T_C_S1)), H5Tclose);
    MPIDDP_CHECK_HDF5(H5Tset_size(type.get(), std::max<size_t>(1, value.size())));
    Hid space(MPIDDP_CHECK_HDF5(H5Screate(H5S_SCALAR)), H5Sclose);
    Hid a(MPIDDP_CHECK_HDF5(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
    MPIDDP_CHECK_HDF5(H5Awrite(a.get(), type.get(), value.empty() ? " " : value.c_str()));
  };
  {
    const bool bytes = inputs.scalar_type() == torch::kUInt8;
    Hid in =
        write("inputs", inputs, bytes ? H5T_STD_U8LE : H5T_IEEE_F32LE, bytes ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT);
    if (bytes) detail::write_scalar_attr(in.get(), "scale", H5T_NATIVE_DOUBLE, &scale);
    Hid tg = write("targets", targets, classes ? H5T_STD_I64LE : H5T_IEEE_F32LE,
                   classes ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT);
  }
  string_attr(f.get(), "task", classes ? "classification" : "regression");
  if (classes) detail::write_scalar_attr(f.get(), "num_classes", H5T_NATIVE_INT64, &num_classes);
  if (!source.empty()) string_attr(f.get(), "source", source);
  MPIDDP_CHECK_HDF5(H5Fflush(f.get(), H5F_SCOPE_GLOBAL));
  f = Hid();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MPIDDP_CHECK(!ec, "cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(dataset_size), rank_(rank), world_(world_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  MPIDDP_CHECK(world_ > 0 && rank_ >= 0 && rank_ < world_, "sampler: rank outside the world");
  MPIDDP_CHECK(n_ > 0, "sampler: empty dataset");
  // As PyTorch: ceil(n / world) with padding; with drop_last ceil((n - world) / world) = floor(n / world).
  num_samples_ = drop_last_ ? n_ / world_ : (n_ + world_ - 1) / world_;
  MPIDDP_CHECK(num_samples_ > 0, "sampler: " + std::to_string(n_) + " samples cannot give each of " +
                                     std::to_string(world_) + " ranks one with drop_last");
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  if (shuffle_) {
    auto gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(epoch_));
    auto perm = torch::randperm(n_, gen, torch::kLong);
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n_, order.begin());
  } else {
    std::iota(order.begin(), order.end(), 0);
  }
  const int64_t total = num_samples_ * world_;
  // Pad by repeating from the start (every rank gets as many samples), or cut (drop_last).
  for (int64_t i = n_; i < total; ++i) order.push_back(order[static_cast<size_t>((i - n_) % n_)]);
  order.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

torch::Tensor read_idx(const std::string& path) {
  MPIDDP_CHECK(std::filesystem::exists(path), "IDX file '" + path + "' does not exist");
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  MPIDDP_CHECK(f != nullptr, "cannot open '" + path + "'");
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto read_exact = [&](void* buf, size_t n) {
    MPIDDP_CHECK(gzread(f, buf, static_cast<unsigned>(n)) == static_cast<int>(n), "'" + path + "' is truncated");
  };
  unsigned char magic[4];
  read_exact(magic, 4);
  MPIDDP_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] >= 1 && magic[3] <= 4,
               "'" + path + "' is not an IDX file of unsigned bytes");
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char b[4];
    read_exact(b, 4);
    const int64_t n = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    shape.push_back(n);
    total *= n;
  }
  auto t = torch::empty(shape, torch::kUInt8);
  for (int64_t done = 0; done < total;) {  // gzread takes unsigned counts: read in slices
    const int64_t n = std::min<int64_t>(total - done, 1 << 30);
    read_exact(t.data_ptr<uint8_t>() + done, static_cast<size_t>(n));
    done += n;
  }
  return t;
}

}  // namespace mpiddp
