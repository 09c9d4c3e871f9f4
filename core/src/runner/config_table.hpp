// The runner's option table (config.hpp): one row per option, with what it accepts, its default,
// its help and how a value is applied to RunConfig. Private to config.cpp and config_table.cpp.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runner/config.hpp"

namespace strata::options {

// One parsed value: the text as given, and its number for numeric kinds.
struct OptionValue {
  std::string text;
  long long integer = 0;
  double real = 0;
  bool flag = false;
};
using Apply = std::function<void(RunConfig&, const OptionValue&)>;
// A text option's own rule: "" when `value` is fine, else what is wrong with it.
using Rule = std::string (*)(const std::string& value);

// One option: its description (RunnerOption) and what the core does with it.
struct Row {
  RunnerOption option;
  Apply apply;
  Rule rule = nullptr;
  std::string rule_accepts;  // text options: what the rule allows, for messages
  std::string example;       // text options: a value the rule allows
};

// Every row, in help order (also the order values are applied: the model preset before the sizes
// that override it).
const std::vector<Row>& rows();
// The row of option `name` (without "--"), or null.
const Row* find_row(const std::string& name);
// Check `text` against `row`; returns the parsed value or throws ConfigError naming `where`.
OptionValue check_value(const Row& row, const std::string& where, const std::string& text);

std::string join(const std::vector<std::string>& v, const char* sep = ", ");
// "" when `path` names a readable regular file, else what is wrong with it.
std::string readable_file_rule(const std::string& path);
bool is_file_name(const std::string& s);
extern const char* const kNameAccepts;

}  // namespace strata::options
