// reco/objective.hpp parses none of the step plan's headers: the plan's types are only declared
// there (a planned call forwards to reco/step_plan/call.hpp), so they stay incomplete in a unit
// that includes the objective alone.
#include <type_traits>

#include "reco/objective.hpp"

template <class T, class = void>
struct is_complete : std::false_type {};
template <class T>
struct is_complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

static_assert(!is_complete<reco::step_plan>::value, "reco/objective.hpp includes the step plan");
static_assert(!is_complete<reco::step_part>::value, "reco/objective.hpp includes the step plan's protocol");

int main() {}
