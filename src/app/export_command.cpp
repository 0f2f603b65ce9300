// `mpiddp export`: a snapshot's trained model in a form Python loads in one line: the TorchScript
// module with its trained weights (torch.jit.load), a state_dict (torch.load + load_state_dict), or
// for the built-in GPT a Hugging Face GPT-2 directory (GPT2LMHeadModel.from_pretrained).
#include <mpiddp/error.hpp>
#include <mpiddp/model.hpp>
#include <mpiddp/snapshot.hpp>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "app/cli.hpp"
#include "app/option_table.hpp"
#include "models/hf_gpt2.hpp"
#include "snapshot/snapshot_codec.hpp"

namespace mpiddp::app {

namespace {

constexpr const char* kModelPrefix = "model/";

// The model's tensors, by the module's own names.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const Snapshot& s) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [key, t] : s.tensors) {
    if (key.rfind(kModelPrefix, 0) == 0) out.emplace_back(key.substr(std::string(kModelPrefix).size()), t);
  }
  MPIDDP_CHECK(!out.empty(), "the snapshot holds no model tensors (no /model group)");
  return out;
}

void write_bytes(const std::string& path, const char* data, size_t size) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(data, static_cast<std::streamsize>(size));
    f.flush();
    if (!f.good()) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      MPIDDP_THROW("cannot write '" + path + "'");
    }
  }
  std::filesystem::rename(tmp, path);
}

// The model files a snapshot can carry (Model::file()), by format: how Python loads each.
const std::map<std::string, std::string> kModelFileFormats = {
    {"torchscript", "TorchScript module (load: torch.jit.load)"},
    {"pt2", ".pt2 program (load: torch.export.load(FILE).module())"}};

// The format of the model file the snapshot carries; "" for a C++ model's.
std::string model_file_format(const Snapshot& s) {
  for (const auto& [format, what] : kModelFileFormats)
    if (s.tensors.count(format)) return format;
  return "";
}

// The snapshot's model file (TorchScript module, .pt2 program) with the trained parameters and
// buffers put in.
std::string export_model_file(const Snapshot& s, const std::string& format, const std::string& name,
                              const std::string& out) {
  auto it = s.tensors.find(format);
  const auto carried = model_file_format(s);
  MPIDDP_CHECK(it != s.tensors.end(), "snapshot '" + name + "' is of " +
                                          (carried.empty() ? "a C++ model" : "a " + carried + " model") + ", not a " +
                                          format + " one: export it with --format " +
                                          (carried.empty() ? "state-dict" : carried) + " or state-dict");
  const auto bytes = it->second.contiguous();
  auto model = load_model_file(
      {format, std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()))},
      name + ":/" + format);
  try {
    load_named(*model, s.tensors, kModelPrefix);
  } catch (const Error& e) {
    MPIDDP_THROW("snapshot '" + name + "': " + e.message());
  }
  std::ostringstream os;
  model->save_file(os);
  const auto text = os.str();
  write_bytes(out, text.data(), text.size());
  const auto tensors = model->named_parameters().size() + model->named_buffers().size();
  return model->description() + " with " + std::to_string(tensors) + " trained tensors, as a " +
         kModelFileFormats.at(format);
}

// torch.save's format (a zip of data.pkl and one record per storage), as torch::pickle_save
// writes it but without TorchScript's type tags on the dict: PyTorch >= 2.6's torch.load
// (weights_only=True by default) refuses the tags' torch.jit._pickle.restore_type_tag.
std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* b, size_t n) { pickle.insert(pickle.end(), b, b + n); }, nullptr, nullptr,
                              nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> out;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
      const auto* c = static_cast<const char*>(p);
      out.insert(out.end(), c, c + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  }  // the writer's destructor writes the zip's central directory
  return out;
}

std::string export_state_dict(const Snapshot& s, const std::string& out) {
  c10::Dict<std::string, torch::Tensor> dict;
  const auto tensors = model_tensors(s);
  for (const auto& [key, t] : tensors) dict.insert(key, t);
  const auto bytes = torch_save_bytes(dict);
  write_bytes(out, bytes.data(), bytes.size());
  return "state_dict of " + std::to_string(tensors.size()) + " tensors (load: model.load_state_dict(torch.load(FILE)))";
}

// The built-in GPT as transformers' GPT-2: DIR/config.json and DIR/model.safetensors.
std::string export_hf(const Snapshot& s, const std::string& name, const std::string& out) {
  const auto shape = s.texts.find(detail::kGptConfigKey);
  MPIDDP_CHECK(
      shape != s.texts.end(),
      "snapshot '" + name + "' is not of the built-in GPT (mpiddp train --model gpt): --format hf writes GPT-2");
  const auto config = GptConfig::from_json(shape->second);
  const auto tensors = model_tensors(s);
  write_hf_gpt2(out, config, std::map<std::string, torch::Tensor>(tensors.begin(), tensors.end()));
  return "Hugging Face GPT-2 (config.json, model.safetensors; load: "
         "transformers.GPT2LMHeadModel.from_pretrained(DIR))";
}

// What the command line says; its initial values are the options' defaults.
struct ExportConfig {
  std::string snapshot, out, format = "auto";
};

// Every `mpiddp export` option, once.
const std::vector<OptionRow<ExportConfig>>& export_options() {
  using C = ExportConfig;
  static const std::vector<OptionRow<C>> rows = {
      option<C>(
          "snapshot", [](C & c) -> auto& { return c.snapshot; }, "the snapshot (HDF5) to export", kNoDefault)
          .positional(),
      option<C>(
          "out", [](C & c) -> auto& { return c.out; }, "the file to write (--format hf: the directory)", kNoDefault),
      option<C>(
          "format", [](C & c) -> auto& { return c.format; },
          "auto (the model's own file format for a TorchScript or .pt2 model, else state-dict) | torchscript | "
          "pt2 | state-dict | hf (the built-in GPT as Hugging Face's GPT-2: config.json + model.safetensors)"),
  };
  return rows;
}

}  // namespace

int run_export(Runtime& runtime, const std::vector<std::string>& args) {
  ExportConfig c;
  const auto options = describe("mpiddp export options", export_options(), c);
  const auto positional = positionals(export_options());
  return run_rank0_command(
      runtime, args,
      {"export",
       "usage: mpiddp export SNAPSHOT --out FILE [--format auto|torchscript|pt2|state-dict|hf]\n\n"
       "Writes a snapshot's trained model for Python: a TorchScript model as its module with the\n"
       "trained weights (torch.jit.load(FILE)), a .pt2 program as its archive with the trained\n"
       "weights (torch.export.load(FILE).module()), any model as a state_dict\n"
       "(model.load_state_dict(torch.load(FILE))), the built-in GPT as a Hugging Face GPT-2 directory\n"
       "(--format hf --out DIR: GPT2LMHeadModel.from_pretrained(DIR)). The snapshot is verified first.\n\n",
       options, &positional,
       [&](const po::variables_map&) {
         MPIDDP_CHECK(!c.snapshot.empty(), "say which snapshot to export (mpiddp export SNAPSHOT --out FILE)");
         MPIDDP_CHECK(!c.out.empty(), "--out is required");
         MPIDDP_CHECK(c.format == "auto" || c.format == "torchscript" || c.format == "pt2" ||
                          c.format == "state-dict" || c.format == "hf",
                      "unknown --format '" + c.format + "' (auto, torchscript, pt2, state-dict, hf)");
       },
       [&] {
         const Snapshot s = read_snapshot(c.snapshot);  // verified: a damaged file is refused here
         const auto format = c.format == "auto" ? model_file_format(s) : c.format;
         return "mpiddp export: wrote " + c.out + ": " +
                (format == "hf"                               ? export_hf(s, c.snapshot, c.out)
                 : format == "torchscript" || format == "pt2" ? export_model_file(s, format, c.snapshot, c.out)
                                                              : export_state_dict(s, c.out)) +
                "\n";
       }});
}

}  // namespace mpiddp::app
