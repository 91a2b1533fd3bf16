// The configuration schema and its readers; see config.h.
#include "apps/dtrain/gpt/config.h"

#include <toml++/toml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "apps/dtrain/gpt/detail/config_entries.h"
#include "core/error.h"
#include "core/units.h"

namespace dtrain::train {

namespace {

using namespace detail;  // (the schema's entries: config_entries.cpp)

const Entry* find_entry(const std::string& key) {
  for (const auto& e : entries()) {
    if (e.key.key == key) return &e;
  }
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string range_text(const ConfigKey& k) {
  auto num = [&](double x) {  // integers in full below 1e15 (1048576, not 1.04858e+06)
    if ((k.kind == Kind::kInt || k.kind == Kind::kBytes) && std::abs(x) < 1e15) {
      return std::to_string(static_cast<int64_t>(x));
    }
    std::ostringstream out;
    out << x;
    return out.str();
  };
  switch (k.kind) {
    case Kind::kInt:
      return str_cat("an integer from ", num(k.min), " to ", num(k.max));
    case Kind::kBytes:
      return str_cat("a byte count from ", num(k.min), " to ", num(k.max),
                     " (an integer, or text such as \"25M\")");
    case Kind::kFloat:
      return str_cat("a number from ", num(k.min), " to ", num(k.max));
    case Kind::kBool:
      return "true or false";
    case Kind::kString: {
      if (k.choices.empty()) return "a string";
      std::string s = "one of";
      for (size_t i = 0; i < k.choices.size(); ++i) s += str_cat(i ? ", " : " ", "\"", k.choices[i], "\"");
      return s;
    }
  }
  return "";
}

// Checks `v` against `k` (converting an integer to a float where a float is wanted) and sets it.
void check_and_set(TrainOptions& o, const Entry& e, Value v, const std::string& origin) {
  const ConfigKey& k = e.key;
  auto wrong = [&](const std::string& what) {
    return ValueError(
        str_cat(origin, ": ", k.key, " = ", v.shown, " ", what, "; it must be ", range_text(k), "."));
  };
  if (k.kind == Kind::kFloat && v.kind == Kind::kInt) {
    v.kind = Kind::kFloat;
    v.d = static_cast<double>(v.i);
  }
  if (k.kind == Kind::kBytes && v.kind == Kind::kString) {
    try {
      v.i = parse_bytes(k.key, v.s);
    } catch (const ValueError&) {
      throw wrong("is not a byte count");
    }
    v.kind = Kind::kBytes;
  }
  if (k.kind == Kind::kBytes && v.kind == Kind::kInt) v.kind = Kind::kBytes;
  if (v.kind != k.kind) {
    const char* what = v.kind == Kind::kInt      ? "is an integer"
                       : v.kind == Kind::kFloat  ? "is a number with a fraction"
                       : v.kind == Kind::kString ? "is a string"
                       : v.kind == Kind::kBool   ? "is a boolean"
                                                 : "is of another kind";
    throw wrong(what);
  }
  if ((k.kind == Kind::kInt || k.kind == Kind::kBytes) &&
      (static_cast<double>(v.i) < k.min || static_cast<double>(v.i) > k.max)) {
    throw wrong("is out of range");
  }
  if (k.kind == Kind::kFloat && (!std::isfinite(v.d) || v.d < k.min || v.d > k.max))
    throw wrong("is out of range");
  if (k.kind == Kind::kString && !k.choices.empty() &&
      std::find(k.choices.begin(), k.choices.end(), v.s) == k.choices.end()) {
    throw wrong("is not a value it takes");
  }
  e.access.set(o, v);
  if (k.key == "train.batch") o.batch_given = true;
  if (k.key == "train.accumulation") o.accumulation_given = true;
}

const Entry& entry_or_throw(const std::string& key, const std::string& origin) {
  const Entry* e = find_entry(key);
  if (e == nullptr) {
    throw ValueError(str_cat(origin, ": unknown key '", key, "'. Did you mean '", nearest_config_key(key),
                             "'? (`dtrain train --help` lists every key with its flag)"));
  }
  return *e;
}

// Walks a TOML table, applying every leaf; `prefix`: the dotted path so far.
void apply_table(TrainOptions& o, const toml::table& t, const std::string& prefix,
                 const std::string& origin) {
  for (const auto& [name, node] : t) {
    const std::string key = prefix.empty() ? std::string(name.str()) : str_cat(prefix, ".", name.str());
    if (const toml::table* sub = node.as_table()) {
      apply_table(o, *sub, key, origin);
      continue;
    }
    const Entry& e = entry_or_throw(key, origin);
    Value v{Kind::kString};
    std::ostringstream shown;
    if (auto x = node.as_integer()) {
      v.kind = Kind::kInt;
      v.i = x->get();
      shown << x->get();
    } else if (auto f = node.as_floating_point()) {
      v.kind = Kind::kFloat;
      v.d = f->get();
      shown << toml_double(f->get());
    } else if (auto s = node.as_string()) {
      v.kind = Kind::kString;
      v.s = s->get();
      shown << toml_string(s->get());
    } else if (auto b = node.as_boolean()) {
      v.kind = Kind::kBool;
      v.b = b->get();
      shown << (b->get() ? "true" : "false");
    } else {
      throw ValueError(str_cat(origin, ": ", key, " is ", node.is_array() ? "an array" : "a date or time",
                               "; it must be ", range_text(e.key), "."));
    }
    v.shown = shown.str();
    check_and_set(o, e, std::move(v), str_cat(origin, " (line ", node.source().begin.line, ")"));
  }
}

}  // namespace

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> v;
    for (const auto& e : entries()) v.push_back(e.key);
    return v;
  }();
  return keys;
}

const ConfigKey* find_config_key(const std::string& key) {
  const Entry* e = find_entry(key);
  return e ? &e->key : nullptr;
}

std::string nearest_config_key(const std::string& key) {
  const auto dot = key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot), leaf = last_part(key);
  // a section within 2 edits of a real one ([optimiser]) narrows the search to that section's keys
  std::string in_section;
  size_t section_d = 3;
  for (const auto& e : entries()) {
    const std::string s = e.key.key.substr(0, e.key.key.find('.'));
    const size_t d = section.empty() ? 3 : edit_distance(section, s);
    if (d < section_d) section_d = d, in_section = s;
  }
  // an abbreviation (lr of learning_rate: the same first letter, its letters in order) counts as 1 edit
  auto abbreviates = [](const std::string& short_form, const std::string& long_form) {
    if (short_form.size() < 2 || short_form.size() >= long_form.size() || short_form[0] != long_form[0])
      return false;
    size_t i = 0;
    for (char c : long_form) i += i < short_form.size() && c == short_form[i];
    return i == short_form.size();
  };
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& e : entries()) {
    if (!in_section.empty() && e.key.key.rfind(in_section + ".", 0) != 0) continue;
    const std::string l = last_part(e.key.key);
    size_t d = std::min(edit_distance(key, e.key.key), edit_distance(leaf, l));
    if (abbreviates(l, leaf)) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = e.key.key;
  }
  return best;
}

void apply_config_file(TrainOptions& o, const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const std::string what(e.description());
    if (!e.source().begin) {  // (no position: the file could not be read)
      throw ValueError(
          str_cat("config ", path, " cannot be read: ", what, ". Name a TOML file that exists."));
    }
    throw ValueError(str_cat("config ", path, " is not valid TOML (line ", e.source().begin.line, ", column ",
                             e.source().begin.column, "): ", what, "."));
  }
  apply_table(o, t, "", str_cat("config ", path));
}

void apply_setting(TrainOptions& o, const std::string& key, const std::string& text,
                   const std::string& origin) {
  const Entry& e = entry_or_throw(key, origin);
  Value v{Kind::kString};
  v.shown = text;
  std::string body = text;
  if (body.size() >= 2 && (body.front() == '"' || body.front() == '\'') && body.back() == body.front()) {
    body = body.substr(1, body.size() - 2);  // a quoted string
    v.s = body;
    v.shown = toml_string(body);
  } else if (e.key.kind == Kind::kBool) {
    if (body == "true" || body == "1") {
      v.kind = Kind::kBool, v.b = true;
    } else if (body == "false" || body == "0") {
      v.kind = Kind::kBool, v.b = false;
    } else {
      v.s = body;
    }
  } else if (e.key.kind == Kind::kInt || e.key.kind == Kind::kBytes || e.key.kind == Kind::kFloat) {
    errno = 0;
    char* end = nullptr;
    const long long i = std::strtoll(body.c_str(), &end, 10);
    if (!body.empty() && end == body.c_str() + body.size() && errno == 0) {
      v.kind = Kind::kInt, v.i = i;
    } else {
      errno = 0;
      const double d = std::strtod(body.c_str(), &end);
      if (!body.empty() && end == body.c_str() + body.size() && errno == 0) {
        v.kind = Kind::kFloat, v.d = d;
      } else {
        v.s = body;  // text: a byte count such as 25M, or a wrong value the check names
      }
    }
  } else {
    v.s = body;
  }
  check_and_set(o, e, std::move(v), origin);
}

void apply_set(TrainOptions& o, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ValueError(str_cat("--set ", assignment, " is not key=value. Use e.g. --set optimizer.lr=3e-4."));
  }
  apply_setting(o, assignment.substr(0, eq), assignment.substr(eq + 1), str_cat("--set ", assignment));
}

std::string effective_config(const TrainOptions& o) {
  std::string out, section;
  for (const auto& e : entries()) {
    const auto dot = e.key.key.find('.');
    const std::string s = e.key.key.substr(0, dot);
    if (s != section) {
      out += str_cat(section.empty() ? "" : "\n", "[", s, "]\n");
      section = s;
    }
    out += str_cat(e.key.key.substr(dot + 1), " = ", e.access.get(o), "\n");
  }
  return out;
}

}  // namespace dtrain::train
