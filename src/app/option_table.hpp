// An option table: each command-line option of a command described once (its flag, its value in the
// command's config struct with the default that struct starts with, its help, the library fields whose
// rules name it, its key in the run's JSON record, how its value is written). The Boost.Program_options
// description and its positional arguments, the field -> flag map for the library's messages and the
// JSON record all come from the table; the CLI reference (docs/cli.md) comes from --help, which prints
// the description. Every mpiddp command declares its options this way.
#pragma once

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mpiddp::app {

namespace po = boost::program_options;

/// How a row's value is written, where that is more than one word of its type after the flag.
struct ValueForm {
  std::string name;         ///< what --help calls the value ("arg" when empty): "--inject-fault RANK (=-1)"
  bool multitoken = false;  ///< takes every word up to the next option: --in a.txt b.txt
  bool positional = false;  ///< also given as a bare word (`mpiddp export SNAPSHOT`): the table's order
};

template <class Config>
struct OptionRow {
  std::string flag;  ///< without the leading "--"; "minbytes,b" adds the short flag -b
  std::string help;
  /// Library option fields (TrainerOptions::batch_size -> "batch_size") whose rules this flag sets.
  std::vector<std::string> fields;
  ValueForm form;
  /// Adds the option to a description, bound to its place in `config`, written as `form` says.
  std::function<void(po::options_description_easy_init&, Config& config, const ValueForm& form)> add;
  /// Its key and value in the run's JSON record (nullopt: not recorded).
  std::function<std::optional<std::pair<std::string, nlohmann::json>>(const Config& config)> record;

  /// The row with --help calling its value `name`.
  OptionRow value_name(std::string name) && {
    form.name = std::move(name);
    return std::move(*this);
  }
  /// The row taking every word up to the next option.
  OptionRow multitoken() && {
    form.multitoken = true;
    return std::move(*this);
  }
  /// The row also given as a bare word, after those of the rows above it.
  OptionRow positional() && {
    form.positional = true;
    return std::move(*this);
  }
};

/// "minbytes" for the flag "minbytes,b".
inline std::string long_name(const std::string& flag) { return flag.substr(0, flag.find(',')); }

/// A flag's key in the run's JSON record and its default library field: its long name with '_' for '-'.
inline std::string record_key(const std::string& flag) {
  std::string key = long_name(flag);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

/// What a row's default says in --help: the config's initial value, a text of its own, or none
/// (an option that is absent unless given).
struct Shown {
  enum Kind { kValue, kText, kNone } kind = kValue;
  std::string text;
};
inline Shown shown_as(std::string text) { return {Shown::kText, std::move(text)}; }
inline const Shown kNoDefault{Shown::kNone, ""};

/// A row for a value at `get(config)`: its default is the value the config starts with. Recorded in
/// the run's JSON under record_key(flag); `fields` default to that name too.
template <class Config, class Get>
OptionRow<Config> option(std::string flag, Get get, std::string help, Shown shown = {},
                         std::optional<std::vector<std::string>> fields = std::nullopt) {
  const std::string key = record_key(flag);
  OptionRow<Config> row;
  row.flag = flag;
  row.help = std::move(help);
  row.fields = fields ? *fields : std::vector<std::string>{key};
  row.add = [flag, get, shown, help = row.help](po::options_description_easy_init& add, Config& config,
                                                const ValueForm& form) {
    auto& place = get(config);
    auto* value = po::value(&place);
    if (shown.kind == Shown::kValue) value->default_value(place);
    if (shown.kind == Shown::kText) value->default_value(place, shown.text);
    if (!form.name.empty()) value->value_name(form.name);
    if (form.multitoken) value->multitoken();
    add(flag.c_str(), value, help.c_str());
  };
  row.record = [key, get](const Config& config) {
    return std::make_optional(std::make_pair(key, nlohmann::json(get(const_cast<Config&>(config)))));
  };
  return row;
}

/// A switch (present or absent, no value), kept in `get(config)`; recorded as `key` (record_key(flag)
/// when empty): `record_as(present)` (the bool itself when null).
template <class Config, class Get>
OptionRow<Config> flag_switch(std::string flag, Get get, std::string help, std::string key = "",
                              std::function<nlohmann::json(bool)> record_as = nullptr) {
  if (key.empty()) key = record_key(flag);
  if (!record_as) record_as = [](bool on) { return nlohmann::json(on); };
  OptionRow<Config> row;
  row.flag = flag;
  row.help = std::move(help);
  row.add = [flag, get, help = row.help](po::options_description_easy_init& add, Config& config, const ValueForm&) {
    add(flag.c_str(), po::bool_switch(&get(config)), help.c_str());
  };
  row.record = [key, get, record_as](const Config& config) {
    return std::make_optional(std::make_pair(key, record_as(get(const_cast<Config&>(config)))));
  };
  return row;
}

/// The table as a Boost.Program_options description bound to `config`.
template <class Config>
po::options_description describe(const std::string& caption, const std::vector<OptionRow<Config>>& rows,
                                 Config& config) {
  po::options_description options(caption);
  auto add = options.add_options();
  add("help,h", "show this help");
  for (const auto& row : rows) row.add(add, config, row.form);
  return options;
}

/// The table's bare words: each positional row takes the next one (a multitoken row all the rest).
template <class Config>
po::positional_options_description positionals(const std::vector<OptionRow<Config>>& rows) {
  po::positional_options_description positional;
  for (const auto& row : rows) {
    if (row.form.positional) positional.add(long_name(row.flag).c_str(), row.form.multitoken ? -1 : 1);
  }
  return positional;
}

/// "--batch-size" for the library field "batch_size" (the first row naming it); "" for none.
template <class Config>
std::string flag_for_field(const std::vector<OptionRow<Config>>& rows, const std::string& field) {
  for (const auto& row : rows) {
    if (std::find(row.fields.begin(), row.fields.end(), field) != row.fields.end()) return "--" + long_name(row.flag);
  }
  return "";
}

/// Every recorded option's value in `config`, as one JSON object.
template <class Config>
nlohmann::json record(const std::vector<OptionRow<Config>>& rows, const Config& config) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& row : rows) {
    if (!row.record) continue;
    if (auto entry = row.record(config)) j[entry->first] = entry->second;
  }
  return j;
}

}  // namespace mpiddp::app
