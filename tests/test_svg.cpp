// The training layer's SVG helpers: escaping, chart geometry and atomic writes.
#include <doctest/doctest.h>

#include "helpers.h"
#include "train/svg.h"


using namespace mf;

namespace {
size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("xml_escape escapes the five XML specials") {
  CHECK(train::xml_escape("a<b & \"c\" 'd'>") == "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
}

TEST_CASE("line chart: one polyline per series with its finite points, titles escaped") {
  std::string svg = train::line_chart_svg("loss <train>", "epoch",
                                          {{"train", {1, 2, 3}, {3.0, 2.0, 1.5}}, {"valid", {1, 2, 3}, {3.2, NAN, 2.0}}});
  CHECK(svg.starts_with("<svg "));
  CHECK(svg.find("loss &lt;train&gt;") != std::string::npos);
  CHECK(count(svg, "<polyline") == 2);
  // The first series' points span the plot: x from the left edge (70) to the right edge (720 - 160).
  CHECK(svg.find("points=\"70.0,") != std::string::npos);
  CHECK(svg.find("560.0,") != std::string::npos);
}

TEST_CASE("heatmap: one cell per value, shaded by value, and shape errors") {
  std::string svg = train::heatmap_svg("attention", {"a", "b"}, {"x", "y", "z"}, {{1, 0, 0.5}, {0, 1, 0}});
  CHECK(count(svg, "<rect x=") == 6);
  CHECK(svg.find("fill=\"rgb(0,0,255)\"") != std::string::npos);      // value 1: darkest
  CHECK(svg.find("fill=\"rgb(255,255,255)\"") != std::string::npos);  // value 0: white
  CHECK_THROWS_WITH_AS(train::heatmap_svg("t", {"a"}, {"x"}, {{1, 2}}), "heatmap_svg: a row has 2 values for 1 column labels",
                       Error);
}
