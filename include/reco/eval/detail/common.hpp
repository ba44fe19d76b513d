// What every eval header shares: the error helpers of reco::detail made visible in
// reco::eval::detail, the allocation guard, and the (optionally OpenMP) parallel loop.
#pragma once

#include <new>
#include <string>
#include <utility>

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

// Runs f() and turns an allocation failure into a reco::error naming `argument`: input that
// needs more memory than there is is bad input, reported like any other. `message()` builds the
// text only on failure.
template <class F, class Message>
decltype(auto) guard_allocation(const char* argument, Message&& message, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    fail(argument, "out of memory " + std::forward<Message>(message)());
  }
}

}  // namespace detail
}  // namespace eval
RECO_NAMESPACE_END
