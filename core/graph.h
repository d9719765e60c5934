// The data autograd keeps on tensors: the per-tensor slot and the graph's node interface. The ops
// layer creates nodes while recording; the autograd layer walks them.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

namespace mf {

/// Where one input's gradient goes: into the node that produced the input, or into a leaf's .grad.
struct Edge {
  std::shared_ptr<Node> node;         // set when the input came from an op
  uint32_t output_nr = 0;             // which output of `node`
  std::shared_ptr<TensorImpl> leaf;   // set when the input is a leaf that requires grad
  bool is_valid() const { return node != nullptr || leaf != nullptr; }
};

/// One recorded op on the tape.
struct Node {
  virtual ~Node() = default;

  /// Gradients of the inputs (one per edge; undefined where no gradient flows) given the gradients
  /// of the outputs (zeros where none arrived, or undefined with takes_undefined_grads). sums[i],
  /// where defined, is the gradient input i has summed so far (a leaf's .grad included), which the
  /// node may add its own into in place: it then returns sums[i] itself as input i's gradient, and
  /// the engine adds nothing more.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs, const std::vector<Tensor>& sums) = 0;
  /// The op's name, for errors ("matmul").
  virtual std::string name() const = 0;
  /// Drops saved tensors once backward no longer needs them.
  virtual void release_saved() = 0;

  std::vector<Edge> next_edges;    // one per input
  std::vector<Shape> input_shapes;   // gradients are summed back to these (undoes broadcasting)
  std::vector<DType> input_dtypes;
  std::vector<Shape> output_shapes;  // to materialise zero gradients for outputs that got none
  std::vector<DType> output_dtypes;
  Device device;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;          // place on the tape: later ops have larger numbers
  std::source_location site;         // the user's line that ran the op
  bool released = false;             // saved tensors already freed by a backward
  bool takes_undefined_grads = false;  // outputs that got no gradient reach apply() undefined
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
};

/// Next tape position (monotonic, thread-safe).
uint64_t next_sequence_nr();

/// Whether ops record the graph on this thread (on by default).
bool grad_mode_enabled();
void set_grad_mode(bool enabled);

/// Turns recording off for its scope on this thread (torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

namespace autograd {

/// Whether anomaly detection is on (off by default; torch.autograd.set_detect_anomaly). When on, every
/// op checks its floating outputs and throws mf::Error naming the op and the user's line at the first
/// NaN produced from NaN-free inputs, or inf from finite inputs (an op given a non-finite value to
/// write, as masked_fill(-inf), is exempt); backward checks each node's gradients the same way and
/// names the forward op and the line that created it. Slow (every result is scanned): for debugging.
/// When off, an op pays one branch. The setting is global, as PyTorch's is.
bool is_anomaly_enabled();
void set_detect_anomaly(bool enabled);

/// Turns anomaly detection on (or off) for its scope, restoring the previous setting
/// (torch.autograd.detect_anomaly).
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true) : previous_(is_anomaly_enabled()) { set_detect_anomaly(enabled); }
  ~DetectAnomalyGuard() { set_detect_anomaly(previous_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

/// Marks this thread as running backward rules for its scope (the engine does this), so that
/// anomaly detection checks each node's gradients instead of the ops inside its backward rule.
class BackwardScope {
 public:
  BackwardScope();
  ~BackwardScope();
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;
  /// True inside a BackwardScope on this thread.
  static bool active();
};

}  // namespace autograd

}  // namespace mf
