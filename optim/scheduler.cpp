#include "optim/scheduler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace mf::optim {

using json = nlohmann::json;

namespace {

/// Every group's lr.
std::vector<double> group_lrs(const Optimizer& optimizer) {
  std::vector<double> lrs;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) lrs.push_back(optimizer.lr(g));
  return lrs;
}

/// A saved epoch or step counter, refused outside [0, kMaxStepCount] (the schedules add to it).
int64_t counter(const json& state, const char* key, const char* who) {
  const auto value = state.at(key).get<int64_t>();
  MF_CHECK(value >= 0 && value <= kMaxStepCount, "{}::load_state_json: {} is {}, outside [0, 2^53]", who, key, value);
  return value;
}

/// Parses scheduler state, turning the JSON library's errors into mf::Error.
template <typename Fn>
void parse_state(const char* who, const std::string& text, Fn&& fn) {
  try {
    fn(json::parse(text));
  } catch (const json::exception& e) {
    fail("{}::load_state_json: malformed state: {}", who, e.what());
  }
}

}  // namespace

// ---- LRScheduler --------------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lrs_(group_lrs(optimizer)) {}

void LRScheduler::apply() {
  last_lr_.clear();
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    last_lr_.push_back(lr_at(last_epoch_, base_lrs_[g]));
    optimizer_.set_lr(g, last_lr_.back());
  }
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

std::string LRScheduler::state_json() const {
  return json{{"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}}.dump();
}

void LRScheduler::load_state_json(const std::string& text) {
  parse_state("LRScheduler", text, [&](const json& j) {
    auto base_lrs = j.at("base_lrs").get<std::vector<double>>();
    MF_CHECK(base_lrs.size() == optimizer_.num_param_groups(),
             "LRScheduler::load_state_json: the state has {} groups, the optimizer {}", base_lrs.size(),
             optimizer_.num_param_groups());
    last_epoch_ = counter(j, "last_epoch", "LRScheduler");
    base_lrs_ = std::move(base_lrs);
  });
  apply();
}

// ---- NoamLR -------------------------------------------------------------------------------------

NoamLR::NoamLR(Optimizer& optimizer, int64_t d_model, int64_t warmup, double factor)
    : LRScheduler(optimizer), d_model_(d_model), warmup_(warmup), factor_(factor) {
  MF_CHECK(d_model > 0 && warmup > 0 && factor > 0, "NoamLR: d_model ({}), warmup ({}) and factor ({}) must be > 0",
           d_model, warmup, factor);
  apply();
}

double NoamLR::lr_at(int64_t epoch, double /*base_lr*/) const {
  const auto t = static_cast<double>(epoch + 1);
  return factor_ / std::sqrt(static_cast<double>(d_model_)) *
         std::min(1 / std::sqrt(t), t * std::pow(static_cast<double>(warmup_), -1.5));
}

// ---- LinearWarmupCosine -------------------------------------------------------------------------

LinearWarmupCosine::LinearWarmupCosine(Optimizer& optimizer, int64_t warmup, int64_t total_steps, double min_lr)
    : LRScheduler(optimizer), warmup_(warmup), total_(total_steps), min_lr_(min_lr) {
  MF_CHECK(warmup >= 0 && warmup < total_steps && min_lr >= 0,
           "LinearWarmupCosine: need 0 <= warmup < total_steps and min_lr >= 0 (got warmup {}, total_steps {}, "
           "min_lr {})", warmup, total_steps, min_lr);
  apply();
}

double LinearWarmupCosine::lr_at(int64_t epoch, double base_lr) const {
  const int64_t t = epoch + 1;
  if (t <= warmup_) return base_lr * static_cast<double>(t) / static_cast<double>(warmup_);
  double progress = std::min(1.0, static_cast<double>(t - warmup_) / static_cast<double>(total_ - warmup_));
  return min_lr_ + (base_lr - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

// ---- StepLR -------------------------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  MF_CHECK(step_size > 0 && gamma > 0, "StepLR: step_size ({}) and gamma ({}) must be > 0", step_size, gamma);
  apply();
}

double StepLR::lr_at(int64_t epoch, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

// ---- ReduceLROnPlateau --------------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, PlateauOptions options)
    : optimizer_(optimizer), options_(options), last_lr_(group_lrs(optimizer)) {
  const PlateauOptions& o = options_;
  MF_CHECK(o.factor > 0 && o.factor < 1, "ReduceLROnPlateau: factor must be in (0, 1), got {}", o.factor);
  MF_CHECK(o.patience >= 0 && o.cooldown >= 0, "ReduceLROnPlateau: patience ({}) and cooldown ({}) must be >= 0",
           o.patience, o.cooldown);
  MF_CHECK(o.threshold >= 0 && o.min_lr >= 0, "ReduceLROnPlateau: threshold ({}) and min_lr ({}) must be >= 0",
           o.threshold, o.min_lr);
  best_ = o.maximize ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

bool ReduceLROnPlateau::is_better(double metric) const {
  return options_.maximize ? metric > best_ * (1 + options_.threshold) : metric < best_ * (1 - options_.threshold);
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    for (size_t g = 0; g < optimizer_.num_param_groups(); ++g) {
      double old_lr = optimizer_.lr(g), new_lr = std::max(old_lr * options_.factor, options_.min_lr);
      if (old_lr - new_lr > options_.eps) optimizer_.set_lr(g, new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = group_lrs(optimizer_);
}

std::string ReduceLROnPlateau::state_json() const {
  // JSON has no infinity: an unset best (no metric yet) is saved as null.
  return json{{"best", std::isfinite(best_) ? json(best_) : json(nullptr)},
              {"num_bad_epochs", num_bad_epochs_},
              {"cooldown_counter", cooldown_counter_},
              {"last_epoch", last_epoch_}}
      .dump();
}

void ReduceLROnPlateau::load_state_json(const std::string& text) {
  parse_state("ReduceLROnPlateau", text, [&](const json& j) {
    double best = j.at("best").is_null() ? (options_.maximize ? -std::numeric_limits<double>::infinity()
                                                              : std::numeric_limits<double>::infinity())
                                         : j.at("best").get<double>();
    const char* who = "ReduceLROnPlateau";
    auto bad = counter(j, "num_bad_epochs", who), cooldown = counter(j, "cooldown_counter", who),
         epoch = counter(j, "last_epoch", who);
    best_ = best;
    num_bad_epochs_ = bad;
    cooldown_counter_ = cooldown;
    last_epoch_ = epoch;
  });
  last_lr_ = group_lrs(optimizer_);
}

}  // namespace mf::optim
