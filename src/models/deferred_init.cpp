// Deferred initialisation (include/mpiddp/units.hpp): parameters with a shape and no memory.
#include <mpiddp/error.hpp>
#include <mpiddp/units.hpp>

#include <set>

namespace mpiddp {

torch::Tensor deferred_tensor(c10::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto t = torch::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

void defer(const torch::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

bool is_deferred(const torch::Tensor& t) { return t.numel() > 0 && t.has_storage() && t.storage().nbytes() == 0; }

void UnitModule::init_unit(size_t unit) {
  MPIDDP_THROW("unit " + std::to_string(unit) + " has deferred parameters but its module has no init_unit()");
}

void materialise_unit(UnitModule& module, size_t unit) {
  torch::NoGradGuard no_grad;
  bool deferred = false;
  for (auto& p : module.units().at(unit)->parameters(/*recurse=*/true)) {
    if (!is_deferred(p)) continue;
    p.set_data(torch::empty(p.sizes(), p.options()));
    deferred = true;
  }
  if (deferred) module.init_unit(unit);
}

void materialise_units(torch::nn::Module& module) {
  auto* split = dynamic_cast<UnitModule*>(&module);
  std::set<const void*> in_units;
  const size_t units = split ? split->units().size() : 0;
  for (size_t u = 0; u < units; ++u) {
    for (const auto& p : split->units()[u]->parameters(/*recurse=*/true)) in_units.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    MPIDDP_CHECK(!is_deferred(item.value()) || in_units.count(item.value().unsafeGetTensorImpl()),
                 "the deferred parameter '" + item.key() + "' is in no unit of its module: nothing can initialise it");
  }
  for (size_t u = 0; u < units; ++u) materialise_unit(*split, u);
}

}  // namespace mpiddp
