// Small SVG charts: the training loop's loss and BLEU curves, and translate's attention heatmaps,
// written as plain text so they open in any browser without dependencies.
#pragma once

#include <string>
#include <vector>

namespace mf::train {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

/// A line chart of one or more series sharing the x axis, with axes, ticks and a legend. Non-finite
/// points are skipped.
std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::vector<Series>& series);

/// A heatmap: values[row][column] in [0, 1] (darker = larger), rows and columns labelled.
std::string heatmap_svg(const std::string& title, const std::vector<std::string>& row_labels,
                        const std::vector<std::string>& column_labels, const std::vector<std::vector<double>>& values);

/// `text` with &, <, >, " and ' escaped for XML.
std::string xml_escape(const std::string& text);

}  // namespace mf::train
