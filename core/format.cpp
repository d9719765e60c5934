// Follows torch/_tensor_str.py (precision 4, threshold 1000, edgeitems 3, linewidth 80) so that
// printed tensors read the same in both frameworks, wrapping and elision included.
#include "core/format.h"

#include "core/error.h"
#include "core/graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <optional>
#include <ostream>
#include <vector>

namespace mf {
namespace {

constexpr int64_t kThreshold = 1000;  // more elements than this are summarised
constexpr int64_t kEdgeItems = 3;     // entries kept at each end of a summarised dim
constexpr int64_t kLineWidth = 80;
constexpr int64_t kIndent = 7;  // strlen("tensor(")

/// One element, read from the tensor's storage through its strides.
struct Element {
  double real = 0;    // floating dtypes
  int64_t integer = 0;  // int64 and bool
};

/// Whether a dim of this size shows only its first and last kEdgeItems entries.
bool elided(int64_t size, bool summarize) { return summarize && size > 2 * kEdgeItems; }

/// The indices of one dim that are printed.
std::vector<int64_t> shown_indices(int64_t size, bool summarize) {
  std::vector<int64_t> indices;
  bool elide = elided(size, summarize);
  for (int64_t i = 0; i < size; ++i)
    if (!elide || i < kEdgeItems || i >= size - kEdgeItems) indices.push_back(i);
  return indices;
}

/// PyTorch's _Formatter: one width and one notation for every element shown.
class Formatter {
 public:
  Formatter(DType dtype, const std::vector<Element>& shown)
      : floating_(is_floating(dtype)), bool_(dtype == DType::Bool) {
    if (!floating_) {
      for (const Element& e : shown) width_ = std::max(width_, plain(e).size());
      return;
    }
    std::vector<double> finite;  // the nonzero finite values decide the notation
    for (const Element& e : shown)
      if (std::isfinite(e.real) && e.real != 0) finite.push_back(e.real);
    if (finite.empty()) return;
    double lo = std::abs(finite[0]), hi = lo;
    for (double v : finite) {
      lo = std::min(lo, std::abs(v));
      hi = std::max(hi, std::abs(v));
      int_mode_ = int_mode_ && v == std::ceil(v);
    }
    sci_ = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode_ && lo < 1.0e-4);
    for (double v : finite) {
      size_t len = sci_ ? fmt::format("{:.4e}", v).size()
                        : int_mode_ ? fmt::format("{:.0f}", v).size() + 1 : fmt::format("{:.4f}", v).size();
      width_ = std::max(width_, len);
    }
  }

  size_t width() const { return width_; }

  std::string format(const Element& e) const {
    std::string text;
    if (!floating_) {
      text = plain(e);
    } else if (sci_) {
      text = fmt::format("{:.4e}", e.real);
    } else if (int_mode_) {
      text = fmt::format("{:.0f}", e.real);
      if (std::isfinite(e.real)) text += '.';
    } else {
      text = fmt::format("{:.4f}", e.real);
    }
    return std::string(width_ - std::min(width_, text.size()), ' ') + text;
  }

 private:
  std::string plain(const Element& e) const {
    if (bool_) return e.integer ? "True" : "False";
    return std::to_string(e.integer);
  }

  bool floating_, bool_;
  bool int_mode_ = true;
  bool sci_ = false;
  size_t width_ = 1;
};

/// Walks the printed elements of a CPU tensor in the nested-list layout of _tensor_str_with_formatter.
class Printer {
 public:
  explicit Printer(const Tensor& host) : t_(host), summarize_(host.numel() > kThreshold) {
    visit_any_dtype(t_.dtype(), [&]<typename T>() {
      const T* base = static_cast<const T*>(t_.raw_data());
      read_ = [base](int64_t position) {
        Element e;
        if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bfloat16>)
          e.real = readable(static_cast<double>(base[position]));  // PyTorch prints every NaN as "nan"
        else
          e.integer = static_cast<int64_t>(base[position]);
        return e;
      };
    });
    std::vector<Element> shown;
    collect(0, 0, shown);
    formatter_.emplace(t_.dtype(), shown);
  }

  std::string str() const { return nested(0, 0, kIndent); }

 private:
  void collect(int64_t d, int64_t position, std::vector<Element>& shown) const {
    if (d == t_.dim()) {
      shown.push_back(read_(position));
      return;
    }
    for (int64_t i : shown_indices(t_.shape()[d], summarize_)) collect(d + 1, position + i * t_.strides()[d], shown);
  }

  std::string nested(int64_t d, int64_t position, int64_t indent) const {
    if (d == t_.dim()) return formatter_->format(read_(position));
    int64_t size = t_.shape()[d];
    bool last_dim = d + 1 == t_.dim();
    std::vector<std::string> parts;
    for (int64_t i : shown_indices(size, summarize_)) {
      if (elided(size, summarize_) && i == size - kEdgeItems) parts.push_back(last_dim ? " ..." : "...");
      parts.push_back(nested(d + 1, position + i * t_.strides()[d], indent + 1));
    }
    std::string body;
    if (last_dim) {  // rows of as many elements as fit in the line width
      int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / static_cast<int64_t>(formatter_->width() + 2));
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) body += i % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        body += parts[i];
      }
    } else {  // sub-blocks: one newline per dim below this one, so matrices get a blank line between
      std::string separator = ",";
      separator.append(t_.dim() - d - 1, '\n').append(indent + 1, ' ');
      for (size_t i = 0; i < parts.size(); ++i) body += (i > 0 ? separator : "") + parts[i];
    }
    return "[" + body + "]";
  }

  Tensor t_;
  bool summarize_;
  std::function<Element(int64_t)> read_;
  std::optional<Formatter> formatter_;
};

/// "AddBackward" for a node named "add", "LogSoftmaxBackward" for "log_softmax".
std::string backward_name(const std::string& op) {
  std::string name;
  bool upper = true;
  for (char c : op) {
    if (c == '_') {
      upper = true;
      continue;
    }
    name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return name + "Backward";
}

/// _add_suffixes: ", suffix" while the line stays within the width, else on a new indented line.
std::string with_suffixes(std::string text, const std::vector<std::string>& suffixes) {
  // PyTorch's arithmetic, kept as is: with no newline, rfind's -1 counts two columns too many.
  size_t found = text.rfind('\n');
  int64_t newline = found == std::string::npos ? -1 : static_cast<int64_t>(found);
  int64_t line = static_cast<int64_t>(text.size()) - newline + 1;
  for (const std::string& suffix : suffixes) {
    int64_t len = static_cast<int64_t>(suffix.size());
    if (line + len + 2 > kLineWidth) {
      text += ",\n" + std::string(kIndent, ' ') + suffix;
      line = kIndent + len;
    } else {
      text += ", " + suffix;
      line += len + 2;
    }
  }
  return text + ")";
}

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  std::vector<std::string> suffixes;
  if (!t.device().is_cpu()) suffixes.push_back(fmt::format("device='{}'", t.device().str()));
  std::string body;
  if (t.numel() == 0) {
    body = "[]";
    if (t.dim() != 1) {
      std::string sizes;
      for (int64_t s : t.shape()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
      suffixes.push_back(fmt::format("size=({})", sizes));
    }
    if (t.dtype() != DType::Float32) suffixes.push_back(fmt::format("dtype={}", dtype_name(t.dtype())));
  } else {
    bool implied_dtype = t.dtype() == DType::Float32 || t.dtype() == DType::Int64 || t.dtype() == DType::Bool;
    if (!implied_dtype) suffixes.push_back(fmt::format("dtype={}", dtype_name(t.dtype())));
    NoGradGuard no_grad;  // a copy to the host must not join the graph
    body = Printer(t.device().is_cpu() ? t : t.to(Device::cpu())).str();
  }
  if (auto node = t.grad_fn())
    suffixes.push_back(fmt::format("grad_fn=<{}>", backward_name(node->name())));
  else if (t.requires_grad())
    suffixes.push_back("requires_grad=True");
  return with_suffixes("tensor(" + body, suffixes);
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << to_string(t); }

}  // namespace mf
