// Learning-rate schedulers: each sets the learning rates of an optimizer's groups. Call step() once
// after each optimizer.step() (ReduceLROnPlateau: step(metric) once per evaluation).
//
// Step-based schedules (NoamLR, LinearWarmupCosine) count t = 1, 2, ...: the lr they set is the one
// the optimizer's t-th update will use. Construction sets t = 1, and the k-th step() sets t = k + 1.
// StepLR counts epochs from 0 as torch.optim.lr_scheduler.StepLR does.
#pragma once

#include "optim/optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mf::optim {

/// A schedule that is a function of the step count and each group's base lr (its lr when the
/// scheduler was made).
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances the count by one and sets every group's lr.
  void step();
  /// The lrs last set, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Number of step() calls so far.
  int64_t last_epoch() const { return last_epoch_; }
  /// The count and base lrs as JSON, and back (load also sets the optimizer's lrs). load_state_json
  /// throws mf::Error on malformed JSON or a group count that differs from the optimizer's.
  std::string state_json() const;
  void load_state_json(const std::string& json);

 protected:
  /// Reads the base lrs from `optimizer` (which must outlive the scheduler). Derived constructors
  /// call apply() once their fields are set.
  explicit LRScheduler(Optimizer& optimizer);
  /// The lr of a group with base lr `base_lr` after `epoch` step() calls.
  virtual double lr_at(int64_t epoch, double base_lr) const = 0;
  /// Sets every group's lr for the current count.
  void apply();

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

/// The Transformer paper's schedule (Vaswani et al. 2017, section 5.3), replacing the base lr:
/// lr(t) = factor * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5): linear growth for `warmup` steps,
/// peak at t = warmup, then inverse square root decay.
class NoamLR : public LRScheduler {
 public:
  /// Throws mf::Error unless d_model > 0, warmup > 0 and factor > 0.
  NoamLR(Optimizer& optimizer, int64_t d_model, int64_t warmup, double factor = 1.0);

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  int64_t d_model_, warmup_;
  double factor_;
};

/// Linear warmup from base_lr / warmup to base_lr over `warmup` steps, then cosine decay to min_lr
/// at t = total_steps (min_lr after that):
/// lr(t) = base * t / warmup for t <= warmup, else
/// min_lr + (base - min_lr) * (1 + cos(pi * min(1, (t - warmup) / (total - warmup)))) / 2.
class LinearWarmupCosine : public LRScheduler {
 public:
  /// Throws mf::Error unless 0 <= warmup < total_steps and min_lr >= 0.
  LinearWarmupCosine(Optimizer& optimizer, int64_t warmup, int64_t total_steps, double min_lr = 0.0);

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
};

/// lr = base * gamma^floor(epoch / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  /// Throws mf::Error unless step_size > 0 and gamma > 0.
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// ReduceLROnPlateau's options (torch.optim.lr_scheduler.ReduceLROnPlateau's defaults, threshold
/// relative).
struct PlateauOptions {
  bool maximize = false;   // mode "max": larger metrics are better
  double factor = 0.1;     // new lr = max(lr * factor, min_lr)
  int64_t patience = 10;   // bad epochs tolerated before reducing
  double threshold = 1e-4; // better means metric < best * (1 - threshold) (min) or > best * (1 + threshold)
  int64_t cooldown = 0;    // epochs after a reduction during which bad epochs are not counted
  double min_lr = 0;
  double eps = 1e-8;       // a reduction smaller than this is skipped
};

/// Reduces every group's lr by `factor` once the metric has not improved for more than `patience`
/// epochs, exactly as torch.optim.lr_scheduler.ReduceLROnPlateau (threshold_mode "rel").
class ReduceLROnPlateau {
 public:
  /// Throws mf::Error unless 0 < factor < 1, patience >= 0, threshold >= 0, cooldown >= 0, min_lr >= 0.
  explicit ReduceLROnPlateau(Optimizer& optimizer, PlateauOptions options = {});
  /// Records one epoch's metric and reduces the lrs if it is time.
  void step(double metric);
  /// The groups' lrs after the last step (their lrs at construction before any).
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Best metric, bad-epoch and cooldown counters and epoch count as JSON, and back
  /// (load_state_json throws mf::Error on malformed JSON).
  std::string state_json() const;
  void load_state_json(const std::string& json);

 private:
  bool is_better(double metric) const;

  Optimizer& optimizer_;
  PlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace mf::optim
