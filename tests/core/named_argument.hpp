// The argument a reco::error names ("" when f throws none); the message must mention it.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "reco/config.hpp"

namespace reco_test {

inline std::string named_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const reco::error& e) {
    EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos);
    return e.argument();
  }
  return "";
}

}  // namespace reco_test
