// A span bound to a temporary container would dangle once the statement ends.
#include <vector>

#include "reco/batch.hpp"

int main() {
  reco::batch_view<float> b;
  b.rewards = std::vector<float>{1, 0};
  (void)b;
}
