// Learning-rate schedules: factors of each parameter group's initial rate (trainer.hpp).
#include <mpiddp/error.hpp>
#include <mpiddp/trainer.hpp>

#include <cmath>
#include <functional>
#include <string>

#include "common/text.hpp"

namespace mpiddp {

namespace {

// The schedules by name (`mpiddp train --lr-schedule`): each made from its parameters, its warmup
// its own (cosine) or added by with_warmup.
struct NamedSchedule {
  const char* name;
  bool own_warmup;
  LrSchedule (*make)(const LrScheduleParams&);
};

const std::vector<NamedSchedule>& named_schedules() {
  static const std::vector<NamedSchedule> kSchedules = {
      {"none", false, [](const LrScheduleParams&) { return LrSchedule(); }},
      {"step", false, [](const LrScheduleParams& p) { return step_lr(p.step_size, p.gamma); }},
      {"cosine", true, [](const LrScheduleParams& p) { return cosine_lr(p.warmup_steps, p.min_factor); }},
  };
  return kSchedules;
}

const NamedSchedule& schedule_named(const std::string& name, const std::string& what) {
  for (const auto& s : named_schedules()) {
    if (name == s.name) return s;
  }
  MPIDDP_THROW(detail::unknown_name(what, name, lr_schedule_names()));
}

}  // namespace

void check_lr_schedule_params(const LrScheduleParams& p, const std::function<std::string(const std::string&)>& name) {
  const auto n = [&](const char* field) { return name ? name(field) : std::string(field); };
  MPIDDP_CHECK(p.step_size > 0, n("step_size") + " must be > 0, got " + std::to_string(p.step_size));
  MPIDDP_CHECK(p.gamma > 0 && std::isfinite(p.gamma), n("gamma") + " must be > 0, got " + std::to_string(p.gamma));
  MPIDDP_CHECK(p.warmup_steps >= 0, n("warmup_steps") + " must be >= 0, got " + std::to_string(p.warmup_steps));
  MPIDDP_CHECK(p.min_factor >= 0 && p.min_factor <= 1,
               n("min_factor") + " must be in [0, 1], got " + std::to_string(p.min_factor));
}

LrSchedule step_lr(int64_t step_size, double gamma) {
  LrScheduleParams p;
  p.step_size = step_size;
  p.gamma = gamma;
  check_lr_schedule_params(p);
  return [=](const StepInfo& at) { return std::pow(gamma, static_cast<double>(at.epoch / step_size)); };
}

LrSchedule cosine_lr(int64_t warmup_steps, double min_factor) {
  LrScheduleParams p;
  p.warmup_steps = warmup_steps;
  p.min_factor = min_factor;
  check_lr_schedule_params(p);
  return [=](const StepInfo& at) {
    const auto step = static_cast<double>(at.global_step), warmup = static_cast<double>(warmup_steps);
    if (at.global_step < warmup_steps) return (step + 1) / (warmup + 1);
    if (at.global_step > at.total_steps) return min_factor;
    const double span = static_cast<double>(at.total_steps) - warmup;
    const double coeff = span > 0 ? 0.5 * (1.0 + std::cos(M_PI * (step - warmup) / span)) : 1.0;
    return min_factor + coeff * (1.0 - min_factor);
  };
}

LrSchedule with_warmup(LrSchedule schedule, int64_t warmup_steps) {
  LrScheduleParams p;
  p.warmup_steps = warmup_steps;
  check_lr_schedule_params(p);
  return [schedule = std::move(schedule), warmup_steps](const StepInfo& at) {
    double f = schedule ? schedule(at) : 1.0;
    if (at.global_step < warmup_steps) {
      f *= static_cast<double>(at.global_step + 1) / static_cast<double>(warmup_steps);
    }
    return f;
  };
}

std::vector<std::string> lr_schedule_names() {
  std::vector<std::string> names;
  for (const auto& s : named_schedules()) names.emplace_back(s.name);
  return names;
}

void check_lr_schedule_name(const std::string& name, const std::string& what) { schedule_named(name, what); }

LrSchedule lr_schedule_named(const std::string& name, const LrScheduleParams& params, const std::string& what) {
  const NamedSchedule& named = schedule_named(name, what);
  check_lr_schedule_params(params);
  LrSchedule schedule = named.make(params);
  if (named.own_warmup || params.warmup_steps <= 0) return schedule;
  return with_warmup(std::move(schedule), params.warmup_steps);
}

}  // namespace mpiddp
