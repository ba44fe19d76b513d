// The k best items of a stream of (value, index) pairs pushed in increasing index order, under
// the order "larger value first, the earlier index first on equal values": the selection order
// of Clip-Cov and KL-Cov (reco/select/covariance.hpp). A buffer of at most about 2k items is
// cut back to the best k whenever it fills, so a pass over N tokens keeps O(k) memory and
// tests each token with one comparison against the k-th best so far; the cuts cost O(1) per
// item kept. Several streams over disjoint, increasing index ranges merge into the k best of
// all (top_k_merge), so a pass can run on several threads and still select the same items.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

struct ranked_item {
  double value;
  index_t index;
};
// a before b in the selection order.
inline bool ranks_before(const ranked_item& a, const ranked_item& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

class top_k_stream {
 public:
  // least: the smallest value the stream admits until it holds k items (a bound estimated to lie
  // below the k-th best of all streams; -inf: every value).
  void reset(index_t k, double least = -HUGE_VAL) {
    k_ = k;
    items_.clear();
    full_ = false;
    floor_ = 0;
    least_ = least;
    pushed_ = 0;
    capacity_ = 2 * static_cast<std::size_t>(k) + 64;
  }
  // Whether an item of value v pushed now can be among the k best: once k items are held, only
  // a larger value than the k-th best (an equal value has a later index, so it ranks after).
  bool admits(double v) const { return full_ ? v > floor_ : v >= least_; }
  bool full() const { return full_; }
  double floor() const { return floor_; }
  double least() const { return least_; }
  // The items pushed since reset (every one admitted, so at least `least`).
  index_t pushed() const { return pushed_; }
  void push(double v, index_t index) {
    items_.push_back({v, index});
    ++pushed_;
    if (items_.size() >= capacity_) cut();
  }
  // The best min(k, pushed) items, in no order.
  std::vector<ranked_item>& finish() {
    if (items_.size() > static_cast<std::size_t>(k_)) cut();
    return items_;
  }

 private:
  void cut() {
    const auto kth = items_.begin() + static_cast<std::ptrdiff_t>(k_ - 1);
    std::nth_element(items_.begin(), kth, items_.end(), ranks_before);
    floor_ = kth->value;
    items_.resize(static_cast<std::size_t>(k_));
    full_ = true;
  }
  index_t k_ = 0;
  std::vector<ranked_item> items_;
  std::size_t capacity_ = 64;
  bool full_ = false;
  double floor_ = 0;
  double least_ = -HUGE_VAL;
  index_t pushed_ = 0;
};

// The k best of the items of several streams (k > 0), their indices in increasing order into
// `out`.
inline void top_k_merge(std::vector<top_k_stream>& streams, std::size_t used, index_t k,
                        std::vector<ranked_item>& all, std::vector<index_t>& out) {
  all.clear();
  for (std::size_t c = 0; c < used; ++c) {
    const std::vector<ranked_item>& s = streams[c].finish();
    all.insert(all.end(), s.begin(), s.end());
  }
  if (all.size() > static_cast<std::size_t>(k)) {
    std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k - 1), all.end(), ranks_before);
    all.resize(static_cast<std::size_t>(k));
  }
  out.resize(all.size());
  for (std::size_t j = 0; j < all.size(); ++j) out[j] = all[j].index;
  std::sort(out.begin(), out.end());
}

}  // namespace detail
RECO_NAMESPACE_END
