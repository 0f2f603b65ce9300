// `mpiddp bench`: nccl-tests' output and formulas with PARAM's conveniences (sizes with K/M/G,
// JSON and CSV), over any ProcessGroup backend.
#include <mpiddp/backends.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/process_group.hpp>

#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "app/bench.hpp"
#include "app/cli.hpp"
#include "app/option_table.hpp"
#include "comm/collective_harness.hpp"
#include "comm/names.hpp"
#include "common/check.hpp"
#include "common/text.hpp"

namespace mpiddp::app {
namespace bench {

int64_t parse_size(const std::string& text) {
  MPIDDP_CHECK(!text.empty(), "empty size");
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  MPIDDP_CHECK(pos > 0 && pos + 1 >= text.size(),
               "bad size '" + text + "' (expected a number of bytes with an optional K, M or G)");
  int64_t value = 0;
  try {
    value = std::stoll(text.substr(0, pos));
  } catch (const std::exception&) {
    MPIDDP_THROW("size '" + text + "' is too large");
  }
  int64_t scale = 1;
  if (pos < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[pos]))) {
      case 'K':
        scale = int64_t{1} << 10;
        break;
      case 'M':
        scale = int64_t{1} << 20;
        break;
      case 'G':
        scale = int64_t{1} << 30;
        break;
      default:
        MPIDDP_THROW("bad size suffix in '" + text + "' (expected K, M or G)");
    }
  }
  MPIDDP_CHECK(value <= std::numeric_limits<int64_t>::max() / scale, "size '" + text + "' is too large");
  return value * scale;
}

double algbw_gbps(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

std::vector<SizePoint> sweep(Collective c, int64_t min_bytes, int64_t max_bytes, double factor, int element_size,
                             int n) {
  MPIDDP_CHECK(min_bytes > 0 && max_bytes >= min_bytes, "need 0 < minbytes <= maxbytes");
  MPIDDP_CHECK(factor > 1.0, "stepfactor must be > 1");
  const int64_t granule = traits(c).splits() ? static_cast<int64_t>(n) : 1;
  std::vector<SizePoint> points;
  for (double s = static_cast<double>(min_bytes); s <= static_cast<double>(max_bytes) * (1 + 1e-12); s *= factor) {
    const int64_t elements = static_cast<int64_t>(s) / element_size / granule * granule;
    if (elements == 0) continue;
    SizePoint p{elements * element_size, elements};
    if (points.empty() || points.back().count != p.count) points.push_back(p);
  }
  return points;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const auto index = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size()))) - 1;
  return values[index];
}

}  // namespace bench

namespace {

using json = nlohmann::ordered_json;

struct BenchConfig {
  std::string backend;
  std::vector<Collective> collectives;
  int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  int warmup = 0, iters = 0, root = 0;
  bool check = true;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;  // of the buffers
  ReduceOp op = ReduceOp::kSum;
  std::string json_path, csv_path;
};

struct Measurement {
  double time_us = 0;  // average over ranks of each rank's mean time per iteration
  double p50 = 0, p95 = 0, min = 0, max = 0;
  double algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

Measurement measure(ProcessGroup& pg, const Runtime& rt, const BenchConfig& cfg, Collective c,
                    const bench::SizePoint& size, bool in_place) {
  const auto& run = detail::harness(c);
  const detail::CollectiveArgs args{cfg.op, cfg.root};
  const auto options = torch::TensorOptions().dtype(cfg.dtype).device(cfg.device);
  const auto b = detail::make_buffers(c, size.count, options, in_place, pg.rank(), pg.size());
  for (int i = 0; i < cfg.warmup; ++i) run.start(pg, b, args)->wait();
  {
    CollectiveStep step(rt.world(), "barrier before timing");
    MPI_Request rq;
    MPIDDP_CHECK_MPI(MPI_Ibarrier(rt.world(), &rq));
    step.wait(rq);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cfg.iters; ++i) run.start(pg, b, args)->wait();
  const double mine =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / cfg.iters;

  std::vector<double> all(static_cast<size_t>(pg.size()));
  {
    CollectiveStep step(rt.world(), "all-gather of the ranks' times");
    MPI_Request rq;
    MPIDDP_CHECK_MPI(MPI_Iallgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, rt.world(), &rq));
    step.wait(rq);
  }
  Measurement m;
  for (double t : all) m.time_us += t / static_cast<double>(all.size());
  m.p50 = bench::percentile(all, 50);
  m.p95 = bench::percentile(all, 95);
  m.min = *std::min_element(all.begin(), all.end());
  m.max = *std::max_element(all.begin(), all.end());
  m.algbw = bench::algbw_gbps(size.bytes, m.time_us * 1e-6);
  m.busbw = m.algbw * traits(c).bus_factor(pg.size());
  if (cfg.check) {
    // Inputs refilled with the harness's pattern, one more run, its output against the closed form.
    const int64_t wrong = detail::verify(pg, c, b, args);
    int64_t total = 0;
    for (int64_t w : allgather_int64(rt.world(), {wrong})) total += w;
    m.wrong = total;
  }
  return m;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string row(const bench::SizePoint& s, const std::string& type, const std::string& redop, int root,
                const Measurement& oop, const Measurement& ip) {
  std::ostringstream out;
  char head[128];
  std::snprintf(head, sizeof head, "%12lld  %12lld  %8s  %6s  %6d", static_cast<long long>(s.bytes),
                static_cast<long long>(s.count), type.c_str(), redop.c_str(), root);
  out << head;
  for (const Measurement* m : {&oop, &ip}) {
    char cols[128];
    std::snprintf(cols, sizeof cols, "  %9.2f  %7.3f  %7.3f  %6s", m->time_us, m->algbw, m->busbw,
                  m->wrong < 0 ? "N/A" : std::to_string(m->wrong).c_str());
    out << cols;
  }
  return out.str();
}

json to_json(const Measurement& m) {
  return {{"time_us", m.time_us},  {"time_us_p50", m.p50},
          {"time_us_p95", m.p95},  {"time_us_min", m.min},
          {"time_us_max", m.max},  {"algbw_gbps", m.algbw},
          {"busbw_gbps", m.busbw}, {"wrong", m.wrong < 0 ? json(nullptr) : json(m.wrong)}};
}

// What the command line says (the options' defaults are its initial values), before it becomes a
// BenchConfig.
struct BenchFlags {
  std::string backend = "mpi", collective = "allreduce", minbytes = "32M", maxbytes = "32M", dtype = "float32";
  std::string device = "auto", op = "sum", json_path, csv_path;
  double factor = 2.0;
  int warmup = 5, iters = 20, check = 1, root = 0;
};

// The collectives bench measures: those that move data, in the table's order.
std::vector<Collective> data_collectives() {
  std::vector<Collective> kinds;
  for (const auto& t : collectives()) {
    if (t.has_data()) kinds.push_back(t.kind);
  }
  return kinds;
}

std::string data_collective_names() {
  std::vector<std::string> names;
  for (auto c : data_collectives()) names.push_back(to_string(c));
  return detail::joined(names, "|");
}

// The element types the groups take, as --dtype spells them.
std::string dtype_names_text() {
  std::vector<std::string> names;
  for (auto dtype : detail::collective_dtypes()) names.push_back(dtype_name(dtype));
  return detail::joined(names, "|");
}

// The reductions and the collectives that take one.
std::string reduce_op_names_text() {
  std::vector<std::string> ops, reducing;
  for (auto op : detail::reduce_ops()) ops.push_back(to_string(op));
  for (const auto& t : collectives()) {
    if (t.reduces) reducing.emplace_back(t.name);
  }
  return detail::joined(ops, "|") + " (" + detail::joined(reducing, ", ") + ")";
}

// Every `mpiddp bench` option, once.
const std::vector<OptionRow<BenchFlags>>& bench_options() {
  using F = BenchFlags;
  static const std::vector<OptionRow<BenchFlags>> rows = {
      option<F>(
          "backend", [](F & f) -> auto& { return f.backend; }, backend_names("|") + " (those built into this binary)"),
      option<F>(
          "collective", [](F & f) -> auto& { return f.collective; }, data_collective_names() + "|all"),
      option<F>(
          "minbytes,b", [](F & f) -> auto& { return f.minbytes; }, "smallest size S, bytes (K, M, G accepted)"),
      option<F>(
          "maxbytes,e", [](F & f) -> auto& { return f.maxbytes; }, "largest size S"),
      option<F>(
          "stepfactor,f", [](F & f) -> auto& { return f.factor; }, "multiply the size by this between steps (> 1)"),
      option<F>(
          "warmup-iters,w", [](F & f) -> auto& { return f.warmup; }, "untimed iterations per size"),
      option<F>(
          "iters,n", [](F & f) -> auto& { return f.iters; }, "timed iterations per size"),
      option<F>(
          "check,c", [](F & f) -> auto& { return f.check; }, "1: verify results against the formula and count #wrong"),
      option<F>(
          "dtype,d", [](F & f) -> auto& { return f.dtype; }, dtype_names_text()),
      option<F>(
          "device", [](F & f) -> auto& { return f.device; },
          "cpu|cuda|auto: where the buffers live (auto: this rank's GPU for nccl, else cpu)"),
      option<F>(
          "op,o", [](F & f) -> auto& { return f.op; }, reduce_op_names_text()),
      option<F>(
          "root,r", [](F & f) -> auto& { return f.root; }, "broadcast root"),
      option<F>(
          "json", [](F & f) -> auto& { return f.json_path; }, "also write the results as JSON to this file (rank 0)",
          kNoDefault),
      option<F>(
          "csv", [](F & f) -> auto& { return f.csv_path; }, "also write the results as CSV to this file (rank 0)",
          kNoDefault),
  };
  return rows;
}

// The flags checked and turned into what the sweep runs. Local: no collective.
BenchConfig config_of(const BenchFlags& f, const Runtime& runtime) {
  BenchConfig cfg;
  cfg.backend = f.backend;
  if (f.collective == "all") {
    cfg.collectives = data_collectives();
  } else {
    cfg.collectives = {parse_collective(f.collective)};
    MPIDDP_CHECK(traits(cfg.collectives[0]).has_data(), "bench measures data collectives, not barrier");
  }
  cfg.min_bytes = bench::parse_size(f.minbytes);
  cfg.max_bytes = bench::parse_size(f.maxbytes);
  MPIDDP_CHECK(cfg.min_bytes > 0, "--minbytes must be > 0");
  MPIDDP_CHECK(cfg.max_bytes >= cfg.min_bytes,
               "--maxbytes (" + f.maxbytes + ") is below --minbytes (" + f.minbytes + ")");
  MPIDDP_CHECK(f.factor > 1.0, "--stepfactor must be > 1");
  MPIDDP_CHECK(f.warmup >= 0, "--warmup-iters must be >= 0");
  MPIDDP_CHECK(f.iters >= 1, "--iters must be >= 1");
  MPIDDP_CHECK(f.check == 0 || f.check == 1, "--check takes 0 or 1");
  cfg.factor = f.factor;
  cfg.warmup = f.warmup;
  cfg.iters = f.iters;
  cfg.check = f.check == 1;
  cfg.dtype = parse_dtype(f.dtype);
  cfg.op = parse_reduce_op(f.op);
  MPIDDP_CHECK(f.root >= 0 && f.root < runtime.size(),
               "--root " + std::to_string(f.root) + " outside a world of " + std::to_string(runtime.size()));
  cfg.root = f.root;
  MPIDDP_CHECK(f.device == "auto" || f.device == "cpu" || f.device == "cuda",
               "--device takes cpu, cuda or auto, not '" + f.device + "'");
  const auto* backend = find_backend(cfg.backend);  // unknown or unbuilt: check_backend below says so
  const bool cuda = f.device == "cuda" || (f.device == "auto" && backend && backend->default_device == c10::kCUDA);
  cfg.device = cuda ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU);
  check_backend(cfg.backend, cfg.device, runtime, f.device == "cuda" ? "--device cuda" : "--backend " + cfg.backend);
  if (cuda) cfg.device = runtime.device();
  cfg.json_path = f.json_path;
  cfg.csv_path = f.csv_path;
  return cfg;
}

// The results of a sweep: nccl-tests' table on rank 0 as it goes, JSON rows, the totals.
struct SweepResults {
  json rows = json::array();
  double busbw_sum = 0;
  int count = 0;
  int64_t wrong = 0;
};

void write_csv_rows(std::ofstream& csv, Collective c, const bench::SizePoint& size, const std::string& type,
                    const std::string& redop, int root, const Measurement& oop, const Measurement& ip) {
  for (const auto& [placement, m] : {std::pair<const char*, const Measurement*>{"out-of-place", &oop},
                                     std::pair<const char*, const Measurement*>{"in-place", &ip}}) {
    csv << to_string(c) << "," << size.bytes << "," << size.count << "," << type << "," << redop << "," << root << ","
        << placement << "," << m->time_us << "," << m->p50 << "," << m->p95 << "," << m->algbw << "," << m->busbw << ","
        << (m->wrong < 0 ? std::string() : std::to_string(m->wrong)) << "\n";
  }
}

SweepResults run_sweep(ProcessGroup& pg, const Runtime& runtime, const BenchConfig& cfg, std::ofstream& csv) {
  SweepResults out;
  const std::string type = dtype_name(cfg.dtype);
  for (Collective c : cfg.collectives) {
    const auto& t = traits(c);
    const std::string redop = t.reduces ? to_string(cfg.op) : "none";
    const int root = t.rooted ? cfg.root : -1;
    std::ostringstream table;
    table << "#\n# collective " << to_string(c) << "\n"
          << "#                                                    out-of-place                          in-place\n"
          << "#       size         count      type   redop    root       time    algbw    busbw  #wrong       time    "
             "algbw    busbw  #wrong\n"
          << "#        (B)    (elements)                                   (us)   (GB/s)   (GB/s)              (us)   "
             "(GB/s)   (GB/s)\n";
    print_rank0(runtime, table.str());
    if (!pg.supports(c, cfg.dtype, cfg.op)) {
      print_rank0(runtime, "# " + cfg.backend + " does not support " + to_string(c) + " of " + type +
                               (t.reduces ? " with " + redop : std::string()) + ": skipped\n");
      continue;
    }
    for (const auto& size : bench::sweep(c, cfg.min_bytes, cfg.max_bytes, cfg.factor,
                                         static_cast<int>(c10::elementSize(cfg.dtype)), runtime.size())) {
      const Measurement oop = measure(pg, runtime, cfg, c, size, false);
      const Measurement ip = measure(pg, runtime, cfg, c, size, true);
      print_rank0(runtime, row(size, type, redop, root, oop, ip) + "\n");
      out.busbw_sum += oop.busbw + ip.busbw;
      out.count += 2;
      out.wrong += std::max<int64_t>(oop.wrong, 0) + std::max<int64_t>(ip.wrong, 0);
      out.rows.push_back({{"collective", to_string(c)},
                          {"size_bytes", size.bytes},
                          {"count", size.count},
                          {"type", type},
                          {"redop", redop},
                          {"root", root},
                          {"out_of_place", to_json(oop)},
                          {"in_place", to_json(ip)}});
      if (csv.is_open()) write_csv_rows(csv, c, size, type, redop, root, oop, ip);
    }
  }
  return out;
}

void write_json(const BenchConfig& cfg, const Runtime& runtime, const SweepResults& r, double avg_busbw) {
  json doc = {{"backend", cfg.backend},
              {"world_size", runtime.size()},
              {"node_count", runtime.node_count()},
              {"dtype", dtype_name(cfg.dtype)},
              {"device", cfg.device.is_cuda() ? "cuda" : "cpu"},
              {"op", to_string(cfg.op)},
              {"warmup_iters", cfg.warmup},
              {"iters", cfg.iters},
              {"check", cfg.check},
              {"results", r.rows},
              {"avg_busbw_gbps", avg_busbw},
              {"wrong", r.wrong},
              {"result", r.wrong == 0 ? "OK" : "FAILED"}};
  std::ofstream j(cfg.json_path);
  MPIDDP_CHECK(j.good(), "cannot write --json file '" + cfg.json_path + "'");
  j << doc.dump(2) << "\n";
}

}  // namespace

int run_bench(Runtime& runtime, const std::vector<std::string>& args) {
  BenchFlags flags;
  const auto options = describe("mpiddp bench options", bench_options(), flags);
  BenchConfig cfg;
  po::variables_map vm;
  auto parse = [&] {
    vm = parse_options(options, args);
    if (!vm.count("help")) cfg = config_of(flags, runtime);
  };
  if (auto code = agree_on_local_phase(runtime, "bench", parse)) return *code;
  if (vm.count("help")) {
    print_help(runtime,
               "usage: mpirun -np N mpiddp bench [options]\n\n"
               "Measures collective time and bandwidth per size like nccl-tests: algbw = S / t, busbw = algbw x\n"
               "2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter, alltoall; S = the whole array), 1\n"
               "(broadcast). Exit status 1 if any element was wrong.\n\n",
               options);
    return kExitOk;
  }
  // Group creation fails on every rank alike (each backend agrees before it can block).
  std::unique_ptr<ProcessGroup> pg;
  if (auto code = agree_on_local_phase(
          runtime, "bench", [&] { pg = make_process_group(cfg.backend, runtime); }, kExitFailure)) {
    return *code;
  }
  std::ostringstream out;
  out << "# mpiddp bench: backend " << cfg.backend << ", " << runtime.size() << " rank(s) on " << runtime.node_count()
      << " node(s), dtype " << dtype_name(cfg.dtype) << ", device " << (cfg.device.is_cuda() ? "cuda" : "cpu")
      << ", warmup " << cfg.warmup << ", iters " << cfg.iters << ", check " << (cfg.check ? 1 : 0) << "\n";
  print_rank0(runtime, out.str());
  std::ofstream csv;
  if (runtime.rank() == 0 && !cfg.csv_path.empty()) {
    csv.open(cfg.csv_path);
    MPIDDP_CHECK(csv.good(), "cannot write --csv file '" + cfg.csv_path + "'");
    csv << "collective,size_bytes,count,type,redop,root,placement,time_us,time_us_p50,time_us_p95,algbw_gbps,"
           "busbw_gbps,wrong\n";
  }
  const SweepResults r = run_sweep(*pg, runtime, cfg, csv);
  const double avg_busbw = r.count ? r.busbw_sum / r.count : 0.0;
  std::ostringstream footer;
  footer << "# Out of bounds values : " << r.wrong << (r.wrong == 0 ? " OK" : " FAILED") << "\n"
         << "# Avg bus bandwidth    : " << fmt("%.6g", avg_busbw) << "\n#\n";
  print_rank0(runtime, footer.str());
  if (runtime.rank() == 0 && !cfg.json_path.empty()) write_json(cfg, runtime, r, avg_busbw);
  return r.wrong == 0 ? kExitOk : kExitFailure;
}

}  // namespace mpiddp::app
