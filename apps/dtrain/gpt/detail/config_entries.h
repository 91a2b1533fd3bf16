// The schema of `dtrain train`'s configuration (config.h), as the readers use it: each key with where its
// value lives in TrainOptions (config_entries.cpp holds the table).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "apps/dtrain/gpt/config.h"

namespace dtrain::train::detail {

using Kind = ConfigKey::Kind;

// A value as read: from TOML (typed) or from text (a flag's or --set's).
struct Value {
  Kind kind;
  int64_t i = 0;
  double d = 0;
  std::string s;
  bool b = false;
  std::string shown;  // as the user wrote it, for messages
};

// Where each key's value lives in TrainOptions.
struct Access {
  std::function<void(TrainOptions&, const Value&)> set;
  std::function<std::string(const TrainOptions&)> get;  // TOML text
};

struct Entry {
  ConfigKey key;
  Access access;
};

// Every key, in the order effective_config() writes them.
const std::vector<Entry>& entries();

// A TOML basic string, and the shortest TOML float that reads back as `d`.
std::string toml_string(const std::string& s);
std::string toml_double(double d);

}  // namespace dtrain::train::detail
