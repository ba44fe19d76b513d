// Shared n-gram counting for BLEU, Self-BLEU and Distinct-n.
//
//   std::vector<reco::eval::token_ids> ids = reco::eval::tokenise_whitespace(texts);
//
// Text is split on ASCII whitespace (space, \t, \n, \v, \f, \r), like Python's str.split() on
// ASCII input, and every distinct word of the set gets an id in first-seen order, so a set of
// texts and a set of token-id vectors go through the same counting code.
//
// The counting (detail::count_ngrams) reads each sequence once per order, whatever n is, and
// groups every n-gram's occurrences by sequence; comparisons between sequences then only walk
// those groups, never the text again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

using token_ids = std::vector<std::int64_t>;

namespace detail {

inline bool is_ascii_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

// Words of `text` (views into it), split on runs of ASCII whitespace.
inline std::vector<std::string_view> split_whitespace(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_ascii_space(text[i])) ++i;
    const std::size_t start = i;
    while (i < text.size() && !is_ascii_space(text[i])) ++i;
    if (i > start) words.push_back(text.substr(start, i - start));
  }
  return words;
}

// Maps words to ids 0, 1, 2, ... in first-seen order. Holds views: the texts must outlive it.
class word_vocabulary {
 public:
  token_ids encode(std::string_view text) {
    token_ids out;
    for (std::string_view w : split_whitespace(text)) {
      auto it = ids_.emplace(w, static_cast<std::int64_t>(ids_.size())).first;
      out.push_back(it->second);
    }
    return out;
  }

 private:
  std::unordered_map<std::string_view, std::int64_t> ids_;
};

// Number of bits needed to write v (0 for v = 0).
inline int bit_width(std::uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

// Stable LSD radix sort of (keys, values) by the low `bits` bits of the keys, 11 bits a pass.
// `keys_tmp` / `values_tmp` are scratch of the same size.
template <class Value>
void radix_sort_pairs(std::vector<std::uint64_t>& keys, std::vector<Value>& values,
                      std::vector<std::uint64_t>& keys_tmp, std::vector<Value>& values_tmp, int bits) {
  constexpr int digit_bits = 11;
  constexpr std::size_t buckets = std::size_t{1} << digit_bits;
  const std::size_t n = keys.size();
  keys_tmp.resize(n);
  values_tmp.resize(n);
  std::vector<std::size_t> offset(buckets);
  for (int shift = 0; shift < bits; shift += digit_bits) {
    std::fill(offset.begin(), offset.end(), 0);
    for (std::uint64_t k : keys) ++offset[(k >> shift) & (buckets - 1)];
    if (offset[(keys.empty() ? 0 : keys[0] >> shift) & (buckets - 1)] == n) continue;  // one bucket
    std::size_t sum = 0;
    for (std::size_t& o : offset) {
      const std::size_t c = o;
      o = sum;
      sum += c;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = offset[(keys[i] >> shift) & (buckets - 1)]++;
      keys_tmp[at] = keys[i];
      values_tmp[at] = values[i];
    }
    keys.swap(keys_tmp);
    values.swap(values_tmp);
  }
}

// The n-grams of one order over a set of sequences, grouped by n-gram. Run r (one distinct
// n-gram) owns the groups [run_begin[r], run_begin[r + 1]); group g says that the n-gram occurs
// group_count[g] times in sequence group_seq[g]. A run's groups are in increasing sequence order.
struct ngram_groups {
  std::vector<std::uint32_t> run_begin{0};
  std::vector<std::uint32_t> group_seq;
  std::vector<std::uint32_t> group_count;
  std::vector<std::uint64_t> total;   // per sequence: number of n-grams (length - n + 1, or 0)
  std::vector<std::uint32_t> unique;  // per sequence: distinct n-grams
  std::size_t distinct() const { return run_begin.size() - 1; }
};

// Orders 1..max_order of every sequence; result[n - 1] is order n. The caller guarantees
// max_order >= 1 and bounded (result holds max_order entries: Distinct-n never asks past the
// longest sequence, BLEU at most bleu_max_order_limit), and fewer than 2^32 - 1 tokens in all
// (positions and ids are 32-bit).
//
// Every n-gram gets an exact dense id, without hashing: the n-gram at position i is the pair
// (id of the (n-1)-gram at i, id of the token at i + n - 1), packed into one integer key; a
// stable radix sort of all keys of an order with their positions puts equal n-grams next to each
// other, in position (hence sequence) order, and numbering the runs gives the ids of the order.
//
// stop_when_unique: stop after the first order whose n-grams all occur once (the result is then
// shorter than max_order). Every longer n-gram then occurs once too (a repeated n-gram would
// repeat its prefix), so a caller that needs only a high order can take its counts from the
// lengths; for natural text this happens after a few orders.
inline std::vector<ngram_groups> count_ngrams(const std::vector<span<const std::int64_t>>& seqs,
                                              int max_order, bool stop_when_unique = false) {
  const std::size_t num_seqs = seqs.size();
  std::vector<std::uint32_t> start(num_seqs + 1, 0);
  for (std::size_t s = 0; s < num_seqs; ++s) start[s + 1] = start[s] + static_cast<std::uint32_t>(seqs[s].size());
  const std::size_t num_tokens = start.back();

  std::vector<std::uint32_t> unigram(num_tokens), current(num_tokens);
  // Each occurrence travels through the sort as (sequence << 32 | position), so the walk below
  // reads its sequence without a random lookup.
  std::vector<std::uint64_t> keys, keys_tmp, positions, positions_tmp;
  keys.reserve(num_tokens);
  positions.reserve(num_tokens);
  std::int64_t min_token = 0, max_token = 0;
  bool any_token = false;
  for (std::size_t s = 0; s < num_seqs; ++s)
    for (std::int64_t t : seqs[s]) {
      min_token = any_token ? std::min(min_token, t) : t;
      max_token = any_token ? std::max(max_token, t) : t;
      any_token = true;
    }
  int unigram_bits = 0;
  std::size_t previous_distinct = 0;

  std::vector<ngram_groups> orders(static_cast<std::size_t>(max_order));
  for (int n = 1; n <= max_order; ++n) {
    ngram_groups& out = orders[static_cast<std::size_t>(n - 1)];
    out.total.assign(num_seqs, 0);
    out.unique.assign(num_seqs, 0);
    keys.clear();
    positions.clear();
    int bits;
    if (n == 1) {
      // Token ids as offsets from the smallest one: any int64 range works, small ones sort fast.
      for (std::size_t s = 0; s < num_seqs; ++s)
        for (index_t i = 0; i < seqs[s].size(); ++i) {
          keys.push_back(static_cast<std::uint64_t>(seqs[s][i]) - static_cast<std::uint64_t>(min_token));
          positions.push_back((static_cast<std::uint64_t>(s) << 32) | (start[s] + static_cast<std::uint32_t>(i)));
        }
      bits = bit_width(static_cast<std::uint64_t>(max_token) - static_cast<std::uint64_t>(min_token));
    } else {
      const int id_bits = bit_width(previous_distinct > 0 ? previous_distinct - 1 : 0);
      for (std::size_t s = 0; s < num_seqs; ++s) {
        const std::size_t len = start[s + 1] - start[s];
        for (std::size_t i = 0; i + static_cast<std::size_t>(n) <= len; ++i) {
          const std::uint32_t at = start[s] + static_cast<std::uint32_t>(i);
          keys.push_back((static_cast<std::uint64_t>(current[at]) << unigram_bits) |
                         unigram[at + static_cast<std::uint32_t>(n - 1)]);
          positions.push_back((static_cast<std::uint64_t>(s) << 32) | at);
        }
      }
      bits = id_bits + unigram_bits;
    }
    radix_sort_pairs(keys, positions, keys_tmp, positions_tmp, bits);

    // Walk the sorted occurrences: a new run at every key change, a new group at every change
    // of sequence inside a run.
    out.group_seq.reserve(keys.size());
    out.group_count.reserve(keys.size());
    out.run_begin.reserve(keys.size() + 1);
    std::uint32_t run_id = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint32_t pos = static_cast<std::uint32_t>(positions[i]);
      const std::uint32_t s = static_cast<std::uint32_t>(positions[i] >> 32);
      const bool new_run = i == 0 || keys[i] != keys[i - 1];
      if (new_run && i > 0) {
        ++run_id;
        out.run_begin.push_back(static_cast<std::uint32_t>(out.group_seq.size()));
      }
      current[pos] = run_id;
      ++out.total[s];
      if (new_run || out.group_seq.back() != s) {
        out.group_seq.push_back(s);
        out.group_count.push_back(1);
        ++out.unique[s];
      } else {
        ++out.group_count.back();
      }
    }
    if (!keys.empty()) out.run_begin.push_back(static_cast<std::uint32_t>(out.group_seq.size()));
    previous_distinct = out.distinct();
    if (n == 1) {
      unigram = current;
      unigram_bits = bit_width(previous_distinct > 0 ? previous_distinct - 1 : 0);
    }
    if (stop_when_unique && n < max_order && previous_distinct == keys.size()) {
      orders.resize(static_cast<std::size_t>(n));
      break;
    }
  }
  return orders;
}

template <class Seq>
std::vector<span<const std::int64_t>> as_spans(const std::vector<Seq>& seqs) {
  std::vector<span<const std::int64_t>> out;
  out.reserve(seqs.size());
  for (const auto& s : seqs) out.emplace_back(s.data(), static_cast<index_t>(s.size()));
  return out;
}

inline void require_token_budget(const std::vector<span<const std::int64_t>>& seqs,
                                 const std::string& argument) {
  std::uint64_t total = 0;
  for (const auto& s : seqs) total += static_cast<std::uint64_t>(s.size());
  require(total < 0xFFFFFFFFull, argument, "more than 2^32 - 1 tokens in one set");
}

}  // namespace detail

// Whitespace tokenisation of a set of texts with ids shared across the set (first-seen order).
inline std::vector<token_ids> tokenise_whitespace(const std::vector<std::string>& texts) {
  detail::word_vocabulary vocabulary;
  std::vector<token_ids> out;
  out.reserve(texts.size());
  for (const std::string& t : texts) out.push_back(vocabulary.encode(t));
  return out;
}

}  // namespace eval
RECO_NAMESPACE_END
