// What every eval header shares: the error helpers of reco::detail made visible in
// reco::eval::detail, and the optional OpenMP loop macro.
#pragma once

#include <string>

#include "reco/config.hpp"
#include "reco/eval/detail/parallel.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {
namespace detail {

using ::reco::detail::fail;
using ::reco::detail::require;

// "name[i]" for error messages that point into a list.
inline std::string indexed(const std::string& name, std::size_t i) {
  return name + "[" + std::to_string(i) + "]";
}

}  // namespace detail
}  // namespace eval
RECO_NAMESPACE_END
