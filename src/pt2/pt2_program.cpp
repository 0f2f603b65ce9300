#include <mpiddp/compat.hpp>
#if MPIDDP_HAS_PT2

#include "pt2/pt2_program.hpp"

#include <mpiddp/error.hpp>

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "common/text.hpp"

namespace mpiddp::detail {

namespace {

// A run's state: one value per graph value (tensors, symbolic ints and bools), and the device
// every device argument means.
struct Frame {
  std::vector<c10::IValue> slots;
  c10::Device device;
};

// How a prepared argument gets its value at run time.
using Fetch = std::function<c10::IValue(const Frame&)>;

// A Python number where the op takes a tensor: a 0-dim "wrapped number" tensor, as PyTorch's
// argument parser makes (type promotion treats it as a scalar).
at::Tensor wrapped_number(const c10::IValue& v) {
  auto t = v.isDouble() ? at::scalar_to_tensor(v.toDouble())
           : v.isBool() ? at::scalar_to_tensor(v.toBool())
                        : at::scalar_to_tensor(v.toInt());
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

bool takes_tensor(const c10::TypePtr& type) {
  if (!type) return false;
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) return takes_tensor(optional->getElementType());
  return false;
}

// Tensor?[] (aten::index's indices): a list given as as_tensors goes as a list of optionals.
bool takes_optional_tensors(const c10::TypePtr& type) {
  auto list = type ? type->cast<c10::ListType>() : nullptr;
  return list && list->getElementType()->kind() == c10::TypeKind::OptionalType;
}

bool takes_float(const c10::TypePtr& type) {
  if (!type) return false;
  if (type->kind() == c10::TypeKind::FloatType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) return takes_float(optional->getElementType());
  return false;
}

// A serialized float: a number, or torch.export's "Infinity", "-Infinity", "NaN" (JSON has none).
double real(const Json& v) {
  if (!v.is_string()) return v.get<double>();
  const auto text = v.get<std::string>();
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  MPIDDP_CHECK(text == "NaN", "'" + text + "' where a float is serialized");
  return std::numeric_limits<double>::quiet_NaN();
}

// The first key of a serialized union ({"as_tensor": {...}}).
std::string kind_of(const Json& arg) { return arg.empty() ? "" : arg.begin().key(); }

// Which value of the frame holds a graph value, by its name; compiling a node also lists the
// values it reads (so that a run can drop each after its last reader).
class Scope {
 public:
  int define(const std::string& name) {
    auto [it, added] = slots_.emplace(name, static_cast<int>(slots_.size()));
    return it->second;
  }
  int read(const std::string& name, const std::string& where) {
    auto it = slots_.find(name);
    MPIDDP_CHECK(it != slots_.end(), where + " reads '" + name + "', which no earlier node makes");
    reads_.push_back(it->second);
    return it->second;
  }
  std::vector<int> take_reads() { return std::exchange(reads_, {}); }
  int size() const { return static_cast<int>(slots_.size()); }

 private:
  std::map<std::string, int> slots_;
  std::vector<int> reads_;
};

Fetch constant(c10::IValue v) {
  return [v = std::move(v)](const Frame&) { return v; };
}

}  // namespace

// One graph (the program's, or a higher-order op's subgraph), compiled.
class Pt2Graph {
 public:
  Pt2Graph(const Json& graph, const std::string& where);
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, c10::Device device) const;

 private:
  struct Step {
    Step(std::string what, std::function<void(Frame&)> run) : what(std::move(what)), run(std::move(run)) {}
    std::string what;  // for messages: "node 'linear_1' (aten::linear)"
    std::function<void(Frame&)> run;
    std::vector<int> release;  // values no later step reads
  };

  Fetch argument(const Json& arg, const c10::TypePtr& expected, const std::string& where);
  Fetch symbolic(const Json& arg, const std::string& where);
  std::vector<Fetch> positional(const Json& inputs, size_t from, const std::string& where);
  std::function<void(Frame&, std::vector<c10::IValue>)> store(const Json& outputs, const std::string& where);
  Step op_step(const Json& node, const std::string& where);
  Step symbolic_step(const Json& node, const std::string& where);
  Step higher_order_step(const Json& node, const std::string& where);
  void plan_releases(const std::vector<std::vector<int>>& reads, const std::vector<int>& kept);

  std::string where_;
  Scope scope_;
  std::vector<int> inputs_;
  std::vector<Step> steps_;
  std::vector<Fetch> outputs_;
};

namespace {

// The number or truth value a symbolic operand holds.
double real_of(const c10::IValue& v) {
  return v.isDouble() ? v.toDouble() : v.isBool() ? static_cast<double>(v.toBool()) : static_cast<double>(v.toInt());
}
bool any_real(const std::vector<c10::IValue>& a) {
  for (const auto& v : a)
    if (v.isDouble()) return true;
  return false;
}
int64_t floor_div(int64_t a, int64_t b) {
  MPIDDP_CHECK(b != 0, "integer division by zero in a symbolic shape");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

using SymbolicFn = std::function<c10::IValue(const std::vector<c10::IValue>&)>;

// An arithmetic one: int for ints, float where either side is one (Python's rule).
SymbolicFn arithmetic(std::function<int64_t(int64_t, int64_t)> on_ints,
                      std::function<double(double, double)> on_reals) {
  return [on_ints, on_reals](const std::vector<c10::IValue>& a) -> c10::IValue {
    if (any_real(a)) return on_reals(real_of(a.at(0)), real_of(a.at(1)));
    return on_ints(a.at(0).isBool() ? a.at(0).toBool() : a.at(0).toInt(),
                   a.at(1).isBool() ? a.at(1).toBool() : a.at(1).toInt());
  };
}
SymbolicFn comparison(std::function<bool(double, double)> test) {
  return [test](const std::vector<c10::IValue>& a) -> c10::IValue { return test(real_of(a.at(0)), real_of(a.at(1))); };
}

// The Python functions exported graphs call on symbolic sizes (torch.fx's symbolic ops).
const std::map<std::string, SymbolicFn>& symbolic_ops() {
  static const std::map<std::string, SymbolicFn> table = {
      {"_operator.add", arithmetic(std::plus<int64_t>(), std::plus<double>())},
      {"_operator.sub", arithmetic(std::minus<int64_t>(), std::minus<double>())},
      {"_operator.mul", arithmetic(std::multiplies<int64_t>(), std::multiplies<double>())},
      {"_operator.floordiv", arithmetic(floor_div, [](double a, double b) { return std::floor(a / b); })},
      {"_operator.mod", arithmetic([](int64_t a, int64_t b) { return a - floor_div(a, b) * b; },
                                   [](double a, double b) { return a - std::floor(a / b) * b; })},
      {"_operator.truediv", [](const auto& a) -> c10::IValue { return real_of(a.at(0)) / real_of(a.at(1)); }},
      {"_operator.pow",
       [](const auto& a) -> c10::IValue {
         if (!any_real(a) && a.at(1).toInt() >= 0) {
           int64_t r = 1;
           for (int64_t i = 0; i < a.at(1).toInt(); ++i) r *= a.at(0).toInt();
           return r;
         }
         return std::pow(real_of(a.at(0)), real_of(a.at(1)));
       }},
      {"_operator.neg",
       [](const auto& a) -> c10::IValue {
         return a.at(0).isDouble() ? c10::IValue(-a.at(0).toDouble()) : c10::IValue(-a.at(0).toInt());
       }},
      {"_operator.eq", comparison(std::equal_to<double>())},
      {"_operator.ne", comparison(std::not_equal_to<double>())},
      {"_operator.lt", comparison(std::less<double>())},
      {"_operator.le", comparison(std::less_equal<double>())},
      {"_operator.gt", comparison(std::greater<double>())},
      {"_operator.ge", comparison(std::greater_equal<double>())},
      {"_operator.and_", [](const auto& a) -> c10::IValue { return a.at(0).toBool() && a.at(1).toBool(); }},
      {"_operator.or_", [](const auto& a) -> c10::IValue { return a.at(0).toBool() || a.at(1).toBool(); }},
      {"_operator.not_", [](const auto& a) -> c10::IValue { return !a.at(0).toBool(); }},
      {"torch.sym_not", [](const auto& a) -> c10::IValue { return !a.at(0).toBool(); }},
      {"torch.sym_max",
       [](const auto& a) -> c10::IValue { return real_of(a.at(0)) >= real_of(a.at(1)) ? a.at(0) : a.at(1); }},
      {"torch.sym_min",
       [](const auto& a) -> c10::IValue { return real_of(a.at(0)) <= real_of(a.at(1)) ? a.at(0) : a.at(1); }},
      {"torch.sym_float", [](const auto& a) -> c10::IValue { return real_of(a.at(0)); }},
      {"torch.sym_int", [](const auto& a) -> c10::IValue { return static_cast<int64_t>(real_of(a.at(0))); }},
      {"math.ceil", [](const auto& a) -> c10::IValue { return static_cast<int64_t>(std::ceil(real_of(a.at(0)))); }},
      {"math.floor", [](const auto& a) -> c10::IValue { return static_cast<int64_t>(std::floor(real_of(a.at(0)))); }},
      {"math.trunc", [](const auto& a) -> c10::IValue { return static_cast<int64_t>(std::trunc(real_of(a.at(0)))); }},
      {"torch._sym_sqrt", [](const auto& a) -> c10::IValue { return std::sqrt(real_of(a.at(0))); }},
      {"torch.sym_ite", [](const auto& a) -> c10::IValue { return a.at(0).toBool() ? a.at(1) : a.at(2); }},
      {"_operator.pos", [](const auto& a) -> c10::IValue { return a.at(0); }},
      {"_operator.lshift", [](const auto& a) -> c10::IValue { return a.at(0).toInt() << a.at(1).toInt(); }},
      {"_operator.rshift", [](const auto& a) -> c10::IValue { return a.at(0).toInt() >> a.at(1).toInt(); }},
  };
  return table;
}

const std::string kOpsPrefix = "torch.ops.";
// The training IR's check, before a .to(dtype), that its input has the export's dtype and device:
// not run, because mpiddp changes both (autocast makes it bfloat16; the device is the run's).
const std::string kAssertMetadata = "torch.ops.aten._assert_tensor_metadata.default";
const std::string kHigherOrder = "torch.ops.higher_order.";

// "torch.ops.aten.add_.Tensor" -> {"aten::add_", "Tensor"} ("default": the op's unnamed overload).
c10::OperatorName operator_name(const std::string& target) {
  const std::string rest = target.substr(kOpsPrefix.size());
  const auto first = rest.find('.'), last = rest.rfind('.');
  MPIDDP_CHECK(first != std::string::npos && last != first, "'" + target + "' is not a namespace.op.overload name");
  const std::string overload = rest.substr(last + 1);
  return {rest.substr(0, first) + "::" + rest.substr(first + 1, last - first - 1),
          overload == "default" ? "" : overload};
}

}  // namespace

Fetch Pt2Graph::symbolic(const Json& arg, const std::string& where) {
  // {"as_name": "sym_size_int"} | {"as_int": 3} (as_bool, as_float alike)
  if (arg.contains("as_name")) {
    const int slot = scope_.read(arg.at("as_name").get<std::string>(), where);
    return [slot](const Frame& f) { return f.slots[slot]; };
  }
  const auto kind = kind_of(arg);
  if (kind == "as_int") return constant(arg.at(kind).get<int64_t>());
  if (kind == "as_bool") return constant(arg.at(kind).get<bool>());
  if (kind == "as_float") return constant(real(arg.at(kind)));
  MPIDDP_THROW(where + ": a symbolic value of kind '" + kind + "' mpiddp cannot read");
}

Fetch Pt2Graph::argument(const Json& arg, const c10::TypePtr& expected, const std::string& where) {
  const auto kind = kind_of(arg);
  const Json& v = arg.at(kind);
  const bool tensor = takes_tensor(expected);
  if (kind == "as_none") return constant(c10::IValue());
  if (kind == "as_tensor") {
    const int slot = scope_.read(v.at("name").get<std::string>(), where);
    return [slot](const Frame& f) { return f.slots[slot]; };
  }
  if (kind == "as_optional_tensor")
    return v.contains("as_none") ? constant(c10::IValue()) : argument(v, expected, where);
  if (kind == "as_tensors" || kind == "as_optional_tensors") {
    std::vector<int> slots;  // -1: None
    for (const auto& t : v) {
      const Json& named = kind == "as_tensors" ? t : (t.contains("as_tensor") ? t.at("as_tensor") : Json());
      slots.push_back(named.is_null() ? -1 : scope_.read(named.at("name").get<std::string>(), where));
    }
    if (kind == "as_tensors" && !takes_optional_tensors(expected)) {
      return [slots](const Frame& f) {
        std::vector<at::Tensor> list;
        for (int s : slots) list.push_back(f.slots[s].toTensor());
        return c10::IValue(list);
      };
    }
    return [slots](const Frame& f) {
      c10::List<std::optional<at::Tensor>> list;
      for (int s : slots) list.push_back(s < 0 ? std::nullopt : std::optional<at::Tensor>(f.slots[s].toTensor()));
      return c10::IValue(list);
    };
  }
  if (kind == "as_int" || kind == "as_float" || kind == "as_bool") {
    c10::IValue number = kind == "as_int"    ? c10::IValue(v.get<int64_t>())
                         : kind == "as_bool" ? c10::IValue(v.get<bool>())
                                             : c10::IValue(real(v));
    if (tensor) return constant(wrapped_number(number));
    if (kind == "as_int" && takes_float(expected)) return constant(static_cast<double>(v.get<int64_t>()));
    return constant(number);
  }
  if (kind == "as_sym_int" || kind == "as_sym_bool" || kind == "as_sym_float") {
    auto fetch = symbolic(v, where);
    if (!tensor) return fetch;
    return [fetch](const Frame& f) { return c10::IValue(wrapped_number(fetch(f))); };
  }
  if (kind == "as_sym_ints") {
    std::vector<Fetch> items;
    for (const auto& item : v) items.push_back(symbolic(item, where));
    return [items](const Frame& f) {
      std::vector<int64_t> out;
      for (const auto& item : items) out.push_back(item(f).toInt());
      return c10::IValue(out);
    };
  }
  if (kind == "as_ints") return constant(v.get<std::vector<int64_t>>());
  if (kind == "as_floats") {
    std::vector<double> reals;
    for (const auto& x : v) reals.push_back(real(x));
    return constant(reals);
  }
  if (kind == "as_bools") {
    c10::List<bool> bools;
    for (const auto& b : v) bools.push_back(b.get<bool>());
    return constant(bools);
  }
  if (kind == "as_string") return constant(v.get<std::string>());
  if (kind == "as_strings") return constant(v.get<std::vector<std::string>>());
  if (kind == "as_scalar_type") return constant(static_cast<int64_t>(scalar_type_of(v.get<int64_t>(), where)));
  if (kind == "as_layout") return constant(static_cast<int64_t>(layout_of(v.get<int64_t>(), where)));
  if (kind == "as_memory_format") return constant(static_cast<int64_t>(memory_format_of(v.get<int64_t>(), where)));
  if (kind == "as_device") return [](const Frame& f) { return c10::IValue(f.device); };
  MPIDDP_THROW(where + ": an argument of kind '" + kind + "', which mpiddp cannot pass");
}

std::vector<Fetch> Pt2Graph::positional(const Json& inputs, size_t from, const std::string& where) {
  std::vector<Fetch> out;
  for (size_t i = from; i < inputs.size(); ++i) out.push_back(argument(inputs[i].at("arg"), nullptr, where));
  return out;
}

// Where a node's results go: each output names the value it becomes (a list output one per element).
std::function<void(Frame&, std::vector<c10::IValue>)> Pt2Graph::store(const Json& outputs, const std::string& where) {
  struct Target {
    int slot = -1;           // a single value
    std::vector<int> items;  // a list's elements (-1: unnamed)
    bool list = false;
  };
  std::vector<Target> targets;
  for (const auto& out : outputs) {
    const auto kind = kind_of(out);
    Target t;
    if (kind == "as_tensor") {
      t.slot = scope_.define(out.at(kind).at("name").get<std::string>());
    } else if (kind == "as_sym_int" || kind == "as_sym_bool" || kind == "as_sym_float") {
      if (out.at(kind).contains("as_name")) t.slot = scope_.define(out.at(kind).at("as_name").get<std::string>());
    } else if (kind == "as_tensors" || kind == "as_optional_tensors") {
      t.list = true;
      for (const auto& item : out.at(kind)) {
        const Json& named = kind == "as_tensors" ? item : (item.contains("as_tensor") ? item.at("as_tensor") : Json());
        t.items.push_back(named.is_null() ? -1 : scope_.define(named.at("name").get<std::string>()));
      }
    } else {
      MPIDDP_CHECK(kind == "as_none" || kind == "as_int" || kind == "as_bool" || kind == "as_float",
                   where + ": an output of kind '" + kind + "', which mpiddp cannot hold");
    }
    targets.push_back(std::move(t));
  }
  return [targets, where](Frame& f, std::vector<c10::IValue> results) {
    MPIDDP_CHECK(results.size() >= targets.size(), where + " gave " + std::to_string(results.size()) + " results for " +
                                                       std::to_string(targets.size()) + " outputs");
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto& t = targets[i];
      if (t.slot >= 0) f.slots[t.slot] = std::move(results[i]);
      if (!t.list) continue;
      const auto list = results[i].toList();
      for (size_t k = 0; k < t.items.size() && k < list.size(); ++k)
        if (t.items[k] >= 0) f.slots[t.items[k]] = list.get(k);
    }
  };
}

Pt2Graph::Step Pt2Graph::op_step(const Json& node, const std::string& where) {
  const std::string target = node.at("target").get<std::string>();
  const auto name = operator_name(target);
  auto handle = c10::Dispatcher::singleton().findSchema(name);
  MPIDDP_CHECK(handle.has_value(), where + ": no such op in this libtorch (" + compat::torch_version() + ")");
  const auto& schema = handle->schema();
  std::map<std::string, const Json*> given;
  for (const auto& input : node.at("inputs")) given[input.at("name").get<std::string>()] = &input.at("arg");
  std::vector<Fetch> args;
  for (const auto& formal : schema.arguments()) {
    auto it = given.find(formal.name());
    if (it != given.end()) {
      args.push_back(argument(*it->second, formal.type(), where + " argument '" + formal.name() + "'"));
      given.erase(it);
    } else {
      MPIDDP_CHECK(formal.default_value().has_value(),
                   where + " gives no '" + formal.name() + "', which " + schema.name() + " needs");
      args.push_back(constant(*formal.default_value()));
    }
  }
  MPIDDP_CHECK(given.empty(), where + " passes '" + given.begin()->first + "', which this libtorch's " + schema.name() +
                                  " does not take (exported by another PyTorch?)");
  auto results = store(node.at("outputs"), where);
  const auto op = *handle;
  const size_t returns = schema.returns().size();
  return {where, [op, args, results, returns](Frame& f) {
            torch::jit::Stack stack;
            stack.reserve(std::max(args.size(), returns));
            for (const auto& a : args) stack.push_back(a(f));
            op.callBoxed(stack);
            results(f, std::move(stack));
          }};
}

Pt2Graph::Step Pt2Graph::symbolic_step(const Json& node, const std::string& where) {
  const auto target = node.at("target").get<std::string>();
  const auto fn = symbolic_ops().at(target);
  std::vector<Fetch> operands;
  for (const auto& input : node.at("inputs")) operands.push_back(argument(input.at("arg"), nullptr, where));
  auto results = store(node.at("outputs"), where);
  return {where, [fn, operands, results](Frame& f) {
            std::vector<c10::IValue> values;
            for (const auto& o : operands) values.push_back(o(f));
            results(f, {fn(values)});
          }};
}

namespace {

// Autocast for a subgraph (wrap_with_autocast), as `with torch.autocast(...)`: a nesting level of
// its own, whose end clears the cache of cast weights (else the next step would read this one's).
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, bool enabled, std::optional<c10::ScalarType> dtype,
                std::optional<bool> cache_enabled)
      : device_(device),
        was_enabled_(compat::autocast_enabled(device)),
        was_dtype_(compat::autocast_dtype(device)),
        was_caching_(at::autocast::is_autocast_cache_enabled()) {
    compat::set_autocast(device, enabled, dtype.value_or(was_dtype_));
    if (cache_enabled) at::autocast::set_autocast_cache_enabled(*cache_enabled);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(was_caching_);
    compat::set_autocast(device_, was_enabled_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
  bool was_caching_;
};

std::vector<c10::IValue> values_of(const std::vector<Fetch>& fetches, const Frame& f) {
  std::vector<c10::IValue> out;
  for (const auto& fetch : fetches) {
    auto v = fetch(f);
    if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) out.emplace_back(t);
    } else {
      out.push_back(std::move(v));
    }
  }
  return out;
}

bool truth_of(const c10::IValue& v) { return v.isTensor() ? v.toTensor().item<bool>() : v.toBool(); }

}  // namespace

Pt2Graph::Step Pt2Graph::higher_order_step(const Json& node, const std::string& where) {
  const auto target = node.at("target").get<std::string>();
  const auto op = target.substr(kHigherOrder.size());
  const auto& inputs = node.at("inputs");
  auto subgraph = [&](size_t i) {
    const auto& arg = inputs.at(i).at("arg");
    MPIDDP_CHECK(arg.contains("as_graph"), where + ": argument " + std::to_string(i) + " is not a subgraph");
    return std::make_shared<Pt2Graph>(arg.at("as_graph").at("graph"),
                                      where + " subgraph '" + arg.at("as_graph").at("name").get<std::string>() + "'");
  };
  auto results = store(node.at("outputs"), where);
  if (op == "cond") {  // cond(pred, true_fn, false_fn, operands)
    auto pred = argument(inputs.at(0).at("arg"), nullptr, where);
    auto on_true = subgraph(1), on_false = subgraph(2);
    auto operands = positional(inputs, 3, where);
    return {where, [=](Frame& f) {
              const auto& branch = truth_of(pred(f)) ? on_true : on_false;
              results(f, branch->run(values_of(operands, f), f.device));
            }};
  }
  if (op == "while_loop") {  // while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    auto test = subgraph(0), body = subgraph(1);
    auto carried = positional(inputs, 2, where);
    MPIDDP_CHECK(carried.size() == 2, where + ": while_loop without its carried and additional inputs");
    return {where, [=](Frame& f) {
              auto state = values_of({carried[0]}, f);
              const auto extra = values_of({carried[1]}, f);
              auto with_extra = [&extra](std::vector<c10::IValue> v) {
                v.insert(v.end(), extra.begin(), extra.end());
                return v;
              };
              while (truth_of(test->run(with_extra(state), f.device).at(0)))
                state = body->run(with_extra(state), f.device);
              results(f, std::move(state));
            }};
  }
  if (op == "wrap_with_set_grad_enabled") {  // (enabled, body, *args)
    const bool enabled = inputs.at(0).at("arg").at("as_bool").get<bool>();
    auto body = subgraph(1);
    auto args = positional(inputs, 2, where);
    return {where, [=](Frame& f) {
              torch::AutoGradMode mode(enabled);
              results(f, body->run(values_of(args, f), f.device));
            }};
  }
  if (op == "wrap_with_autocast") {  // (device_type, dtype, enabled, cache_enabled, body, *args)
    // The device type it was exported on: autocast follows the run's device instead.
    const auto device_name = inputs.at(0).at("arg").at("as_string").get<std::string>();
    MPIDDP_CHECK(device_name == "cpu" || device_name == "cuda",
                 where + ": autocast on device type '" + device_name + "', which mpiddp does not train on");
    const auto& dtype_arg = inputs.at(1).at("arg");
    std::optional<c10::ScalarType> dtype;
    if (dtype_arg.contains("as_scalar_type"))
      dtype = scalar_type_of(dtype_arg.at("as_scalar_type").get<int64_t>(), where);
    const bool enabled = inputs.at(2).at("arg").at("as_bool").get<bool>();
    const auto& cache_arg = inputs.at(3).at("arg");
    std::optional<bool> cache_enabled;
    if (cache_arg.contains("as_bool")) cache_enabled = cache_arg.at("as_bool").get<bool>();
    auto body = subgraph(4);
    auto args = positional(inputs, 5, where);
    return {where, [=](Frame& f) {
              // The program's device type is what it was exported on: autocast follows the run's device.
              AutocastScope scope(f.device.type(), enabled, dtype, cache_enabled);
              results(f, body->run(values_of(args, f), f.device));
            }};
  }
  MPIDDP_THROW(where + " calls the higher-order op " + target +
               ", which mpiddp cannot run (it runs cond, while_loop, wrap_with_set_grad_enabled, wrap_with_autocast)");
}

Pt2Graph::Pt2Graph(const Json& graph, const std::string& where) : where_(where) {
  for (const auto& input : graph.at("inputs")) {
    const auto kind = kind_of(input);
    const Json& v = input.at(kind);
    if (kind == "as_tensor") {
      inputs_.push_back(scope_.define(v.at("name").get<std::string>()));
    } else if ((kind == "as_sym_int" || kind == "as_sym_bool" || kind == "as_sym_float") && v.contains("as_name")) {
      inputs_.push_back(scope_.define(v.at("as_name").get<std::string>()));
    } else {
      inputs_.push_back(scope_.define("<input " + std::to_string(inputs_.size()) + ">"));
    }
  }
  std::vector<std::vector<int>> reads;
  for (const auto& node : graph.at("nodes")) {
    const auto target = node.at("target").get<std::string>();
    std::string made;
    for (const auto& out : node.at("outputs")) {
      if (out.contains("as_tensor")) made = out.at("as_tensor").at("name").get<std::string>();
      if (!made.empty()) break;
    }
    const auto what = where_ + " node " + (made.empty() ? "" : "'" + made + "' ") + "(" + target + ")";
    if (target == kAssertMetadata) continue;
    if (target.rfind(kHigherOrder, 0) == 0) {
      steps_.push_back(higher_order_step(node, what));
    } else if (target.rfind(kOpsPrefix, 0) == 0) {
      steps_.push_back(op_step(node, what));
    } else if (symbolic_ops().count(target)) {
      steps_.push_back(symbolic_step(node, what));
    } else {
      MPIDDP_THROW(what + ": mpiddp cannot run '" + target + "'");
    }
    reads.push_back(scope_.take_reads());
  }
  for (const auto& out : graph.at("outputs")) outputs_.push_back(argument(out, nullptr, where_ + " output"));
  plan_releases(reads, scope_.take_reads());
}

// Each value is dropped after the last step that reads it (as Python drops an intermediate when its
// last reference goes), except the graph's outputs.
void Pt2Graph::plan_releases(const std::vector<std::vector<int>>& reads, const std::vector<int>& kept) {
  std::map<int, size_t> last;
  for (size_t s = 0; s < reads.size(); ++s)
    for (int slot : reads[s]) last[slot] = s;
  const std::set<int> outputs(kept.begin(), kept.end());
  for (const auto& [slot, step] : last)
    if (!outputs.count(slot)) steps_[step].release.push_back(slot);
}

std::vector<c10::IValue> Pt2Graph::run(std::vector<c10::IValue> inputs, c10::Device device) const {
  MPIDDP_CHECK(inputs.size() == inputs_.size(),
               where_ + " takes " + std::to_string(inputs_.size()) + " inputs, given " + std::to_string(inputs.size()));
  Frame f{std::vector<c10::IValue>(static_cast<size_t>(scope_.size())), device};
  for (size_t i = 0; i < inputs.size(); ++i) f.slots[inputs_[i]] = std::move(inputs[i]);
  for (const auto& step : steps_) {
    try {
      step.run(f);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      MPIDDP_THROW(step.what + ": " + first_line(e.what()));
    }
    for (int slot : step.release) f.slots[slot] = c10::IValue();
  }
  std::vector<c10::IValue> out;
  for (const auto& fetch : outputs_) out.push_back(fetch(f));
  return out;
}

namespace {

std::vector<int64_t> exported_sizes(const Json& meta) {
  std::vector<int64_t> out;
  for (const auto& size : meta.at("sizes"))
    out.push_back(size.contains("as_int") ? size.at("as_int").get<int64_t>() : -1);
  return out;
}

Pt2Input bind_input(const Json& spec, const std::string& where) {
  const auto kind = kind_of(spec);
  const Json& v = spec.at(kind);
  Pt2Input in;
  if (kind == "parameter") {
    in.kind = Pt2Input::Kind::Parameter;
    in.target = v.at("parameter_name").get<std::string>();
  } else if (kind == "buffer") {
    in.kind = Pt2Input::Kind::Buffer;
    in.target = v.at("buffer_name").get<std::string>();
    in.persistent = v.value("persistent", true);
  } else if (kind == "tensor_constant") {
    in.kind = Pt2Input::Kind::Constant;
    in.target = v.at("tensor_constant_name").get<std::string>();
  } else if (kind == "user_input") {
    in.kind = Pt2Input::Kind::User;
  } else if (kind == "constant_input") {
    in.kind = Pt2Input::Kind::Value;
    const auto& value = v.at("value");
    const auto vk = kind_of(value);
    if (vk == "as_int")
      in.value = value.at(vk).get<int64_t>();
    else if (vk == "as_float")
      in.value = real(value.at(vk));
    else if (vk == "as_bool")
      in.value = value.at(vk).get<bool>();
    else if (vk == "as_string")
      in.value = value.at(vk).get<std::string>();
    else
      MPIDDP_CHECK(vk == "as_none", where + ": a constant input of kind '" + vk + "' mpiddp cannot pass");
  } else {
    MPIDDP_THROW(where + ": an input of kind '" + kind + "' (custom objects, effect tokens), which mpiddp cannot bind");
  }
  return in;
}

Pt2Output bind_output(const Json& spec, const std::string& where) {
  const auto kind = kind_of(spec);
  const Json& v = spec.at(kind);
  Pt2Output out;
  if (kind == "user_output" || kind == "loss_output") {
    out.kind = Pt2Output::Kind::User;
  } else if (kind == "buffer_mutation") {
    out.kind = Pt2Output::Kind::BufferMutation;
    out.target = v.at("buffer_name").get<std::string>();
  } else if (kind == "parameter_mutation") {
    out.kind = Pt2Output::Kind::ParameterMutation;
    out.target = v.at("parameter_name").get<std::string>();
  } else if (kind == "token" || kind == "user_input_mutation") {
    out.kind = Pt2Output::Kind::Ignored;
  } else {
    MPIDDP_THROW(where + ": an output of kind '" + kind +
                 "' (a joint forward-backward graph?), which mpiddp cannot train");
  }
  return out;
}

}  // namespace

Pt2Program::Pt2Program(const Json& program, std::string where) : where_(std::move(where)) {
  try {
    const auto& version = program.at("schema_version");
    const int64_t major = version.at("major").get<int64_t>(), minor = version.at("minor").get<int64_t>();
    MPIDDP_CHECK(major == kPt2SchemaMajor, where_ + " has schema version " + std::to_string(major) + "." +
                                               std::to_string(minor) + "; mpiddp runs schema " +
                                               std::to_string(kPt2SchemaMajor) +
                                               ".x (torch.export of PyTorch 2.6-2.14)");
    const auto& module = program.at("graph_module");
    const auto& graph = module.at("graph");
    const auto& signature = module.at("signature");
    for (const auto& spec : signature.at("input_specs")) inputs_.push_back(bind_input(spec, where_));
    for (const auto& spec : signature.at("output_specs")) outputs_.push_back(bind_output(spec, where_));
    const auto& graph_inputs = graph.at("inputs");
    MPIDDP_CHECK(graph_inputs.size() == inputs_.size(), where_ + ": its signature and graph disagree on the inputs");
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i].kind != Pt2Input::Kind::User) continue;
      const auto& arg = graph_inputs[i];
      const auto& values = graph.at("tensor_values");
      const bool tensor =
          arg.contains("as_tensor") && values.contains(arg.at("as_tensor").at("name").get<std::string>());
      user_input_sizes_.push_back(tensor ? exported_sizes(values.at(arg.at("as_tensor").at("name").get<std::string>()))
                                         : std::vector<int64_t>{});
    }
    graph_ = std::make_unique<Pt2Graph>(graph, where_);
  } catch (const Json::exception& e) {
    MPIDDP_THROW(where_ + " is not what torch.export writes: " + first_line(e.what()));
  }
}

Pt2Program::~Pt2Program() = default;

std::vector<c10::IValue> Pt2Program::run(std::vector<c10::IValue> inputs, c10::Device device) const {
  return graph_->run(std::move(inputs), device);
}

}  // namespace mpiddp::detail

#endif  // MPIDDP_HAS_PT2
