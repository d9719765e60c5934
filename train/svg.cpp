#include "train/svg.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace mf::train {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

/// About five round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  double span = hi - lo;
  double raw = span / 5, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * magnitude) {
      step = m * magnitude;
      break;
    }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::vector<Series>& series) {
  constexpr double kWidth = 720, kHeight = 420, kLeft = 70, kRight = 160, kTop = 40, kBottom = 50;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const Series& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        x_lo = std::min(x_lo, s.x[i]);
        x_hi = std::max(x_hi, s.x[i]);
        y_lo = std::min(y_lo, s.y[i]);
        y_hi = std::max(y_hi, s.y[i]);
      }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;  // no points: empty axes
  if (x_hi == x_lo) x_hi = x_lo + 1;
  if (y_hi == y_lo) y_hi = y_lo + 1;
  double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return kTop + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{3}</text>\n",
      kWidth, kHeight, kLeft + plot_w / 2, xml_escape(title));
  for (double t : ticks(y_lo, y_hi))
    svg += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
                       kLeft, kLeft + plot_w, py(t), kLeft - 6, py(t) + 4, t);
  for (double t : ticks(x_lo, x_hi))
    svg += fmt::format("<text x=\"{0:.1f}\" y=\"{1}\" text-anchor=\"middle\">{2:g}</text>\n", px(t),
                       kTop + plot_h + 18, t);
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
                     kTop, plot_w, plot_h);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", kLeft + plot_w / 2, kHeight - 10,
                     xml_escape(x_label));
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const char* color = kPalette[k % std::size(kPalette)];
    std::string points;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", color, points);
    double ly = kTop + 16 + 20.0 * static_cast<double>(k);
    svg += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"3\"/>"
                       "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
                       kLeft + plot_w + 12, kLeft + plot_w + 32, ly, color, kLeft + plot_w + 38, ly + 4,
                       xml_escape(s.name));
  }
  return svg + "</svg>\n";
}

std::string heatmap_svg(const std::string& title, const std::vector<std::string>& row_labels,
                        const std::vector<std::string>& column_labels, const std::vector<std::vector<double>>& values) {
  MF_CHECK(values.size() == row_labels.size(), "heatmap_svg: {} rows of values for {} row labels", values.size(),
           row_labels.size());
  for (const auto& row : values)
    MF_CHECK(row.size() == column_labels.size(), "heatmap_svg: a row has {} values for {} column labels", row.size(),
             column_labels.size());
  constexpr double kCell = 28, kLeft = 120, kTop = 130;
  double width = kLeft + kCell * static_cast<double>(column_labels.size()) + 20;
  double height = kTop + kCell * static_cast<double>(row_labels.size()) + 20;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"15\">{2}</text>\n",
      width, height, xml_escape(title));
  for (size_t c = 0; c < column_labels.size(); ++c) {
    double x = kLeft + kCell * (static_cast<double>(c) + 0.5);
    svg += fmt::format("<text transform=\"translate({:.1f},{}) rotate(-60)\">{}</text>\n", x + 4, kTop - 6,
                       xml_escape(column_labels[c]));
  }
  for (size_t r = 0; r < row_labels.size(); ++r) {
    double y = kTop + kCell * static_cast<double>(r);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, y + kCell * 0.65,
                       xml_escape(row_labels[r]));
    for (size_t c = 0; c < column_labels.size(); ++c) {
      double v = std::clamp(values[r][c], 0.0, 1.0);
      int shade = static_cast<int>(std::lround(255 * (1 - v)));
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},255)\">"
                         "<title>{:.3f}</title></rect>\n",
                         kLeft + kCell * static_cast<double>(c), y, kCell, kCell, shade, shade, values[r][c]);
    }
  }
  return svg + "</svg>\n";
}

}  // namespace mf::train
