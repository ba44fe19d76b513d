// Small file helpers: CSV tables, number formatting.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ablation {

// A CSV table read back as strings; columns by name.
struct csv_table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;

  int column(const std::string& name) const {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<int>(i);
    throw std::runtime_error("CSV has no column '" + name + "'");
  }
  bool has(const std::string& name) const { return std::find(header.begin(), header.end(), name) != header.end(); }
  // An empty field is a value that is undefined there (NaN).
  double number(std::size_t row, const std::string& name) const {
    const std::string& v = rows[row][column(name)];
    return v.empty() ? std::numeric_limits<double>::quiet_NaN() : std::stod(v);
  }
  const std::string& text(std::size_t row, const std::string& name) const { return rows[row][column(name)]; }
};

// One CSV line (RFC 4180 quoting: a field in double quotes may hold commas, and "" is a quote).
inline std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', ++i;
      else if (c == '"') quoted = false;
      else cur += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// A cell as CSV text: quoted when it holds a comma, a quote or a line break (a configuration's
// label such as "ReCo, no weight cap" would otherwise shift every later column).
inline std::string csv_cell(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

inline csv_table read_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  csv_table t;
  std::string line;
  if (std::getline(in, line)) t.header = split_csv_line(line);
  while (std::getline(in, line))
    if (!line.empty()) t.rows.push_back(split_csv_line(line));
  return t;
}

// Writes a CSV file (through a temporary file, renamed at close).
class csv_writer {
 public:
  csv_writer(const std::string& path, const std::vector<std::string>& header) : path_(path), out_(path + ".tmp") {
    if (!out_) throw std::runtime_error("cannot write " + path);
    row(header);
  }
  ~csv_writer() { close(); }
  void close() {
    if (!out_.is_open()) return;
    out_.close();
    std::filesystem::rename(path_ + ".tmp", path_);
  }
  void row(const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) out_ << (i ? "," : "") << csv_cell(cells[i]);
    out_ << "\n";
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// Fixed-point text with `digits` decimals ("nan" for NaN).
inline std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Shortest round-trip text of a double for CSV files.
// A value that may be undefined (NaN): written as an empty field.
inline std::string exact_or_empty(double v);

inline std::string exact(double v) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

inline std::string scientific(double v, int digits) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", digits, v);
  return buf;
}

inline std::string duration_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

inline std::string exact_or_empty(double v) { return std::isnan(v) ? std::string() : exact(v); }

}  // namespace ablation
