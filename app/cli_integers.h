// Integer options read as decimal: CLI11 converts integers with strtoll(..., 0), so "00000500"
// (copied from a step_00000500 folder name) would be octal 320 and "0x20" hex 32.
#pragma once

namespace CLI {
class App;
}

namespace app {

// Makes every integer option of `cli` and its subcommands (those added so far) read its values as
// decimal: leading zeros are dropped; a value with a base prefix ("0x..", "0b..", "0o..") is
// refused, naming the option. Call after the last add_option, before parsing.
void read_integers_as_decimal(CLI::App& cli);

}  // namespace app
