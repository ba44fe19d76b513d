// Compares two per-step logs of reco_ablation (runs/<job>/train.csv) column by column:
//
//   reco_ablation_compare A.csv B.csv column:rtol:atol ...
//
// Both files must have the same steps; every listed column must agree at every step within
// |a - b| <= rtol * max(|a|, |b|) + atol. Prints each column's largest relative difference and
// exits 1 on a mismatch (2 on unreadable input).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct table {
  std::vector<std::string> header;
  std::vector<std::vector<double>> rows;
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(cell);
  return out;
}

bool read(const char* path, table& t) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  t.header = split(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> row;
    for (const auto& c : split(line)) row.push_back(std::strtod(c.c_str(), nullptr));
    if (row.size() != t.header.size()) return false;
    t.rows.push_back(row);
  }
  return !t.rows.empty();
}

int column(const table& t, const std::string& name) {
  const auto it = std::find(t.header.begin(), t.header.end(), name);
  return it == t.header.end() ? -1 : static_cast<int>(it - t.header.begin());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s A.csv B.csv column:rtol:atol ...\n", argv[0]);
    return 2;
  }
  table a, b;
  if (!read(argv[1], a) || !read(argv[2], b)) {
    std::fprintf(stderr, "cannot read %s or %s (or no rows)\n", argv[1], argv[2]);
    return 2;
  }
  const int step_a = column(a, "step"), step_b = column(b, "step");
  if (step_a < 0 || step_b < 0 || a.rows.size() != b.rows.size()) {
    std::fprintf(stderr, "the logs have different steps (%zu and %zu rows)\n", a.rows.size(), b.rows.size());
    return 1;
  }
  for (std::size_t i = 0; i < a.rows.size(); ++i)
    if (a.rows[i][step_a] != b.rows[i][step_b]) {
      std::fprintf(stderr, "row %zu: step %g against %g\n", i, a.rows[i][step_a], b.rows[i][step_b]);
      return 1;
    }
  int failures = 0;
  for (int k = 3; k < argc; ++k) {
    std::string name;
    double rtol = 0, atol = 0;
    {
      const std::string s = argv[k];
      const auto p1 = s.find(':'), p2 = s.find(':', p1 == std::string::npos ? 0 : p1 + 1);
      if (p1 == std::string::npos || p2 == std::string::npos) {
        std::fprintf(stderr, "bad column spec '%s' (column:rtol:atol)\n", argv[k]);
        return 2;
      }
      name = s.substr(0, p1);
      rtol = std::strtod(s.substr(p1 + 1, p2 - p1 - 1).c_str(), nullptr);
      atol = std::strtod(s.substr(p2 + 1).c_str(), nullptr);
    }
    const int ca = column(a, name), cb = column(b, name);
    if (ca < 0 || cb < 0) {
      std::fprintf(stderr, "no column '%s'\n", name.c_str());
      return 2;
    }
    double worst = 0;
    for (std::size_t i = 0; i < a.rows.size(); ++i) {
      const double x = a.rows[i][ca], y = b.rows[i][cb];
      const double d = std::fabs(x - y), scale = std::max(std::fabs(x), std::fabs(y));
      if (!std::isfinite(x) || !std::isfinite(y) || d > rtol * scale + atol) {
        std::fprintf(stderr, "step %g, %s: %.17g against %.17g (difference %.3g)\n", a.rows[i][step_a], name.c_str(),
                     x, y, d);
        ++failures;
      }
      if (d > 0) worst = std::max(worst, scale > 0 ? d / scale : INFINITY);
    }
    std::printf("%-12s largest relative difference %.3g over %zu steps (tolerance %g relative + %g)\n",
                name.c_str(), worst, a.rows.size(), rtol, atol);
  }
  return failures == 0 ? 0 : 1;
}
