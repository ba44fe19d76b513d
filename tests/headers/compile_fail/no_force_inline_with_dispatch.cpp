// RECO_NO_FORCE_INLINE with the dispatched SIMD variants on (no RECO_NO_SIMD_DISPATCH): the wide
// variants would call pack functions across instruction sets, so the header refuses it.
#define RECO_NO_FORCE_INLINE
#include "reco/backend/cpu/simd.hpp"

int main() { return 0; }
