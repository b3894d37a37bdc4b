// The message of the std::runtime_error a call throws, for tests that check what an error names.
#pragma once

#include <stdexcept>
#include <string>

namespace testing_support {

// f()'s runtime_error message, or "" when it does not throw one.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace testing_support
