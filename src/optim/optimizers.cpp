// The optimizer table (optim.hpp): everything mpiddp knows of each optimizer kind, in one row.
#include <mpiddp/error.hpp>
#include <mpiddp/optim.hpp>

namespace mpiddp {

namespace {

namespace optim = torch::optim;

template <class State>
ParamStateFields adam_fields(const optim::OptimizerParamState& state) {
  const auto& s = static_cast<const State&>(state);
  ParamStateFields f;
  f.step = s.step();
  f.tensors["exp_avg"] = s.exp_avg();
  f.tensors["exp_avg_sq"] = s.exp_avg_sq();
  if (s.max_exp_avg_sq().defined()) f.tensors["max_exp_avg_sq"] = s.max_exp_avg_sq();
  return f;
}

template <class State>
std::unique_ptr<optim::OptimizerParamState> adam_state(const ParamStateFields& f) {
  auto s = std::make_unique<State>();
  s->step(f.step);
  s->exp_avg(f.tensors.at("exp_avg"));
  s->exp_avg_sq(f.tensors.at("exp_avg_sq"));
  if (const auto m = f.tensors.find("max_exp_avg_sq"); m != f.tensors.end()) s->max_exp_avg_sq(m->second);
  return s;
}

ParamStateFields sgd_fields(const optim::OptimizerParamState& state) {
  ParamStateFields f;
  const auto& m = static_cast<const optim::SGDParamState&>(state).momentum_buffer();
  if (m.defined()) f.tensors["momentum_buffer"] = m;
  return f;
}

std::unique_ptr<optim::OptimizerParamState> sgd_state(const ParamStateFields& f) {
  auto s = std::make_unique<optim::SGDParamState>();
  if (const auto m = f.tensors.find("momentum_buffer"); m != f.tensors.end()) s->momentum_buffer(m->second);
  return s;
}

// The given optimizer's defaults, as its options type.
template <class Options>
const Options& defaults_of(const optim::Optimizer& like) {
  return static_cast<const Options&>(like.defaults());
}

// The options of `opt`'s first group (its defaults where it has none), as its options type.
template <class Options>
const Options& first_group_options(const optim::Optimizer& opt) {
  const auto& groups = opt.param_groups();
  return static_cast<const Options&>(groups.empty() ? opt.defaults() : groups.front().options());
}

// One group, or nanoGPT's two (decay_matrices_only: tensors of two or more dimensions decay).
template <class Options>
std::vector<optim::OptimizerParamGroup> param_groups(const std::vector<torch::Tensor>& params,
                                                     const OptimizerSettings& s, Options options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (!s.decay_matrices_only || p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<Options>(Options(options).weight_decay(s.weight_decay)));
  if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<Options>(Options(options).weight_decay(0.0)));
  return groups;
}

const std::vector<std::string> kAdamFields = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

// Adam and AdamW's row: the same fields, codec and rates; libtorch's class `Torch` or mpiddp's
// fused form `Fused` (what `mpiddp train` makes, and what ZeRO keeps when given one).
template <class Torch, class Fused, class Options, class State>
OptimizerSpec adam_family(std::string name, std::function<bool(const optim::Optimizer&)> is) {
  return {
      std::move(name),
      0.001,
      {"betas", "weight-decay", "weight-decay-params"},
      kAdamFields,
      true,
      [](const optim::Optimizer& opt) { return first_group_options<Options>(opt).amsgrad() ? 3 : 2; },
      std::move(is),
      adam_fields<State>,
      adam_state<State>,
      [](const optim::Optimizer& like,
         std::vector<optim::OptimizerParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
        const auto& d = defaults_of<Options>(like);
        if (dynamic_cast<const Fused*>(&like)) return std::make_unique<Fused>(std::move(groups), d);
        return std::make_unique<Torch>(std::move(groups), d);
      },
      [](const std::vector<torch::Tensor>& params, const OptimizerSettings& s) -> std::shared_ptr<optim::Optimizer> {
        const auto o = Options(s.lr).betas(s.betas);
        return std::make_shared<Fused>(param_groups(params, s, o), o);
      }};
}

}  // namespace

const std::vector<OptimizerSpec>& optimizers() {
  static const std::vector<OptimizerSpec> table = {
      {"sgd",
       0.01,
       {"momentum", "weight-decay", "weight-decay-params"},
       {"momentum_buffer"},
       false,
       [](const optim::Optimizer& opt) { return first_group_options<optim::SGDOptions>(opt).momentum() != 0 ? 1 : 0; },
       [](const optim::Optimizer& o) { return dynamic_cast<const optim::SGD*>(&o) != nullptr; },
       sgd_fields,
       sgd_state,
       [](const optim::Optimizer& like,
          std::vector<optim::OptimizerParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::SGD>(std::move(groups), defaults_of<optim::SGDOptions>(like));
       },
       [](const std::vector<torch::Tensor>& params, const OptimizerSettings& s) -> std::shared_ptr<optim::Optimizer> {
         return std::make_shared<optim::SGD>(param_groups(params, s, optim::SGDOptions(s.lr).momentum(s.momentum)),
                                             optim::SGDOptions(s.lr));
       }},
      adam_family<optim::Adam, FusedAdam, optim::AdamOptions, optim::AdamParamState>(
          "adam",
          [](const optim::Optimizer& o) {
            return dynamic_cast<const optim::Adam*>(&o) != nullptr && dynamic_cast<const optim::AdamW*>(&o) == nullptr;
          }),
      adam_family<optim::AdamW, FusedAdamW, optim::AdamWOptions, optim::AdamWParamState>(
          "adamw", [](const optim::Optimizer& o) { return dynamic_cast<const optim::AdamW*>(&o) != nullptr; }),
  };
  return table;
}

const OptimizerSpec* find_optimizer(const std::string& name) {
  for (const auto& o : optimizers()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

const OptimizerSpec* optimizer_spec_of(const torch::optim::Optimizer& opt) {
  for (const auto& o : optimizers()) {
    if (o.is(opt)) return &o;
  }
  return nullptr;
}

}  // namespace mpiddp
