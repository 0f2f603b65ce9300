// The .pt2 executor (src/pt2) on archives written here, checked against the same ATen calls made
// directly: forward and gradients, a buffer mutated in place, a dynamic batch dimension through the
// symbolic-shape nodes, the trained weights written back, and each bad archive refused in one line.
// tests/system/pt2_cli.sh checks archives that torch.export writes against Python.
#include <gtest/gtest.h>
#include <mpiddp/compat.hpp>
#include <mpiddp/model.hpp>

#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "error_of.hpp"

// A named namespace, not an anonymous one: unity batches put this file beside others whose
// helpers and Json alias have the same short names.
namespace pt2_test {

using mpiddp::testing::error_of;
using Json = nlohmann::ordered_json;

#if MPIDDP_HAS_PT2

Json tensor_meta(const torch::Tensor& t, bool requires_grad) {
  Json sizes = Json::array(), strides = Json::array();
  for (auto s : t.sizes()) sizes.push_back({{"as_int", s}});
  for (auto s : t.strides()) strides.push_back({{"as_int", s}});
  const int dtype = t.scalar_type() == torch::kFloat ? 7 : 5;  // the schema's FLOAT, LONG
  return {{"dtype", dtype},
          {"sizes", sizes},
          {"requires_grad", requires_grad},
          {"device", {{"type", "cpu"}, {"index", nullptr}}},
          {"strides", strides},
          {"storage_offset", {{"as_int", 0}}},
          {"layout", 7}};
}

Json tensor_arg(const std::string& name) { return {{"as_tensor", {{"name", name}}}}; }
Json input(const std::string& name, Json arg) { return {{"name", name}, {"arg", std::move(arg)}, {"kind", 1}}; }

// The program: y = relu(linear(x, w, b)).view(batch * 2, -1) with the batch symbolic, and
// count.add_(1) on a buffer, as torch.export's training IR writes them.
Json program_json(int64_t major, const std::string& relu_op = "torch.ops.aten.relu.default") {
  Json nodes = Json::array();
  nodes.push_back({{"target", "torch.ops.aten.add_.Tensor"},
                   {"inputs", {input("self", tensor_arg("b_count")), input("other", {{"as_int", 1}})}},
                   {"outputs", {tensor_arg("add_")}}});
  nodes.push_back(
      {{"target", "torch.ops.aten.linear.default"},
       {"inputs",
        {input("input", tensor_arg("x")), input("weight", tensor_arg("p_w")), input("bias", tensor_arg("p_b"))}},
       {"outputs", {tensor_arg("linear")}}});
  nodes.push_back(
      {{"target", relu_op}, {"inputs", {input("self", tensor_arg("linear"))}}, {"outputs", {tensor_arg("relu")}}});
  nodes.push_back({{"target", "torch.ops.aten.sym_size.int"},
                   {"inputs", {input("self", tensor_arg("x")), input("dim", {{"as_int", 0}})}},
                   {"outputs", {{{"as_sym_int", {{"as_name", "batch"}}}}}}});
  nodes.push_back({{"target", "_operator.mul"},
                   {"inputs", {input("a", {{"as_sym_int", {{"as_name", "batch"}}}}), input("b", {{"as_int", 2}})}},
                   {"outputs", {{{"as_sym_int", {{"as_name", "rows"}}}}}}});
  nodes.push_back({{"target", "torch.ops.aten.view.default"},
                   {"inputs",
                    {input("self", tensor_arg("relu")),
                     input("size", {{"as_sym_ints", {{{"as_name", "rows"}}, {{"as_int", -1}}}}})}},
                   {"outputs", {tensor_arg("view")}}});
  Json x_meta = tensor_meta(torch::zeros({3, 4}), false);
  x_meta["sizes"][0] = {{"as_expr", {{"expr_str", "s0"}, {"hint", {{"as_int", 3}}}}}};
  Json graph = {{"inputs", {tensor_arg("p_w"), tensor_arg("p_b"), tensor_arg("b_count"), tensor_arg("x")}},
                {"outputs", {tensor_arg("view")}},
                {"nodes", nodes},
                {"tensor_values", {{"x", x_meta}}}};
  Json signature = {{"input_specs",
                     {{{"parameter", {{"arg", {{"name", "p_w"}}}, {"parameter_name", "lin.weight"}}}},
                      {{"parameter", {{"arg", {{"name", "p_b"}}}, {"parameter_name", "lin.bias"}}}},
                      {{"buffer", {{"arg", {{"name", "b_count"}}}, {"buffer_name", "count"}, {"persistent", true}}}},
                      {{"user_input", {{"arg", tensor_arg("x")}}}}}},
                    {"output_specs", {{{"user_output", {{"arg", tensor_arg("view")}}}}}}};
  return {{"graph_module", {{"graph", graph}, {"signature", signature}}},
          {"schema_version", {{"major", major}, {"minor", 17}}}};
}

struct Weights {
  torch::Tensor w = torch::randn({6, 4}, torch::TensorOptions().dtype(torch::kFloat));
  torch::Tensor b = torch::randn({6});
  torch::Tensor count = torch::zeros({}, torch::kLong);
};

void put(caffe2::serialize::PyTorchStreamWriter& zip, const std::string& path, const std::string& bytes) {
  zip.writeRecord(path, bytes.data(), bytes.size());
}
std::string bytes_of(const torch::Tensor& t) { return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()); }

// An archive as torch.export.save writes one; `drop` leaves that record out.
std::string archive(const Json& program, const Weights& weights, const std::string& drop = "") {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter zip([&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  Json config = {
      {"config",
       {{"lin.weight", {{"path_name", "weight_0"}, {"is_param", true}, {"tensor_meta", tensor_meta(weights.w, true)}}},
        {"lin.bias", {{"path_name", "weight_1"}, {"is_param", true}, {"tensor_meta", tensor_meta(weights.b, true)}}},
        {"count",
         {{"path_name", "weight_2"}, {"is_param", false}, {"tensor_meta", tensor_meta(weights.count, false)}}}}}};
  const std::map<std::string, std::string> records = {{"archive_format", "pt2"},
                                                      {"models/model.json", program.dump()},
                                                      {"data/weights/model_weights_config.json", config.dump()},
                                                      {"data/weights/weight_0", bytes_of(weights.w)},
                                                      {"data/weights/weight_1", bytes_of(weights.b)},
                                                      {"data/weights/weight_2", bytes_of(weights.count)}};
  for (const auto& [path, bytes] : records)
    if (path != drop) put(zip, path, bytes);
  zip.writeEndOfFile();
  return out;
}

torch::Tensor named(const mpiddp::NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  return {};
}

TEST(Pt2Executor, ForwardAndGradientsEqualTheDirectCalls) {
  torch::manual_seed(1);
  Weights weights;
  auto model = mpiddp::load_pt2_bytes(archive(program_json(8), weights), "t.pt2");
  auto w = named(model->named_parameters(), "lin.weight");
  ASSERT_TRUE(w.defined());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(torch::equal(w, weights.w));
  for (int64_t batch : {3, 5}) {  // the batch dimension is dynamic
    const auto x = torch::randn({batch, 4});
    auto y = model->forward(x);
    const auto rw = weights.w.clone().requires_grad_(true), rb = weights.b.clone().requires_grad_(true);
    const auto expected = torch::relu(torch::linear(x, rw, rb)).view({batch * 2, -1});
    ASSERT_TRUE(torch::allclose(y, expected)) << y << expected;
    y.pow(2).sum().backward();
    expected.pow(2).sum().backward();
    EXPECT_TRUE(torch::allclose(w.grad(), rw.grad()));
    EXPECT_TRUE(torch::allclose(named(model->named_parameters(), "lin.bias").grad(), rb.grad()));
    w.mutable_grad().reset();
    named(model->named_parameters(), "lin.bias").mutable_grad().reset();
  }
  EXPECT_EQ(named(model->named_buffers(), "count").item<int64_t>(), 2) << "add_ mutates the module's buffer";
}

TEST(Pt2Executor, EvaluationWithTheTrainingProgramLeavesBuffersAsTheyWere) {
  Weights weights;
  auto model = mpiddp::load_pt2_bytes(archive(program_json(8), weights), "t.pt2");
  ASSERT_EQ(model->notes().size(), 1u);  // no eval program: said once
  model->train(false);
  model->forward(torch::randn({2, 4}));
  EXPECT_EQ(named(model->named_buffers(), "count").item<int64_t>(), 1);
  model->train(true);
  EXPECT_EQ(named(model->named_buffers(), "count").item<int64_t>(), 0);
}

TEST(Pt2Executor, SavedArchiveHoldsTheTrainedWeights) {
  Weights weights;
  auto model = mpiddp::load_pt2_bytes(archive(program_json(8), weights), "t.pt2");
  {
    torch::NoGradGuard no_grad;
    named(model->named_parameters(), "lin.weight").add_(1.5);
  }
  model->forward(torch::randn({2, 4}));
  std::ostringstream out;
  model->save_file(out);
  auto again = mpiddp::load_pt2_bytes(out.str(), "saved.pt2");
  EXPECT_TRUE(torch::equal(named(again->named_parameters(), "lin.weight"), weights.w + 1.5));
  EXPECT_TRUE(torch::equal(named(again->named_parameters(), "lin.bias"), weights.b));
  EXPECT_EQ(named(again->named_buffers(), "count").item<int64_t>(), 1);
}

TEST(Pt2Executor, BadArchivesAreRefusedInOneLine) {
  Weights weights;
  const auto good = archive(program_json(8), weights);
  auto refusal = [](const std::string& bytes) { return error_of([&] { mpiddp::load_pt2_bytes(bytes, "bad.pt2"); }); };
  const std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"truncated", {good.substr(0, good.size() / 2), "is not a .pt2 archive"}},
      {"another schema major", {archive(program_json(9), weights), "schema version 9.17"}},
      {"an unknown op", {archive(program_json(8, "torch.ops.aten.no_such_op.default"), weights), "aten.no_such_op"}},
      {"a missing weight blob", {archive(program_json(8), weights, "data/weights/weight_1"), "data/weights/weight_1"}},
      {"no archive_format", {archive(program_json(8), weights, "archive_format"), "not a .pt2 one"}},
  };
  for (const auto& [what, bad] : cases) {
    const auto message = refusal(bad.first);
    EXPECT_NE(message.find(bad.second), std::string::npos) << what << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << what << ": " << message;
  }
}

TEST(Pt2Executor, StaticShapesAreChecked) {
  Weights weights;
  auto program = program_json(8);
  program["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {{"as_int", 3}};
  auto model = mpiddp::load_pt2_bytes(archive(program, weights), "static.pt2");
  EXPECT_NE(error_of([&] {
              model->forward(torch::randn({5, 4}));
            }).find("exported for input 0 of shape [3, 4]"),
            std::string::npos);
}

#else

TEST(Pt2Executor, OlderLibtorchRefusesInOneLine) {
  const auto message = error_of([] { mpiddp::load_pt2_bytes("PK", "m.pt2"); });
  EXPECT_NE(message.find("need libtorch >= 2.6"), std::string::npos) << message;
}

#endif

}  // namespace pt2_test
