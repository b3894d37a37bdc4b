#include "app/cli_integers.h"

#include <CLI/CLI.hpp>

#include <string>

namespace app {
namespace {

// "00042" -> "42", "-007" -> "-7", "0" and "000" -> "0"; anything else as it was. A base prefix
// is an error (strtoll would take it silently).
std::string as_decimal(std::string& value) {
  const size_t sign = (!value.empty() && (value[0] == '-' || value[0] == '+')) ? 1 : 0;
  if (value.size() > sign + 1 && value[sign] == '0') {
    const char c = value[sign + 1];
    if (c == 'x' || c == 'X' || c == 'b' || c == 'B' || c == 'o' || c == 'O')
      return "expects a decimal integer (got " + value + ")";
    const size_t first = value.find_first_not_of('0', sign);
    const bool digits = value.find_first_not_of("0123456789", sign) == std::string::npos;
    if (digits) value = value.substr(0, sign) + (first == std::string::npos ? "0" : value.substr(first));
  }
  return "";
}

bool is_integer_type(const std::string& type_name) {
  return type_name.rfind("INT", 0) == 0 || type_name.rfind("UINT", 0) == 0;
}

}  // namespace

void read_integers_as_decimal(CLI::App& cli) {
  for (CLI::Option* opt : cli.get_options()) {
    if (!is_integer_type(opt->get_type_name())) continue;
    // transform() puts the validator first, so range checks after it see the decimal value; an
    // empty description leaves the option's help text as it was.
    opt->transform(CLI::Validator(as_decimal, ""));
  }
  for (CLI::App* sub : cli.get_subcommands([](CLI::App*) { return true; })) read_integers_as_decimal(*sub);
}

}  // namespace app
