// A backend that declares every primitive of reco/backend/concept.hpp (declarations are all a
// syntax-only compile needs); RECO_TEST_OMIT_SEGMENTED_SORT leaves one out, and
// RECO_TEST_DEVICE_MEMORY declares memory the host cannot address.
#pragma once

#include <cstddef>

#include "reco/batch.hpp"
#include "reco/workspace.hpp"

struct declared_backend {
#ifdef RECO_TEST_DEVICE_MEMORY
  static constexpr bool host_accessible = false;  // memory the host cannot address (as reco::cuda)
#else
  static constexpr bool host_accessible = true;
#endif
  struct scratch_state {};
  declared_backend with_scratch(scratch_state*, reco::memory_resource*) const;
  static void release_scratch(scratch_state&);
  void* allocate(std::size_t) const;
  void deallocate(void*, std::size_t) const;
  static void release_at_end(void*, std::size_t);
  declared_backend for_work(reco::index_t) const;
  template <class F>
  void for_each(reco::index_t, F) const;
  template <class Acc, class F, class Merge>
  void reduce(reco::index_t, F, Merge, Acc*) const;
  template <class Acc, class F, class Merge>
  void reduce_tokens(const reco::token_layout&, F, Merge, Acc*) const;
  void order_statistics(double*, reco::index_t, const reco::index_t*, int, double*) const;
#ifndef RECO_TEST_OMIT_SEGMENTED_SORT
  void segmented_sort(double*, const reco::token_layout&) const;
#endif
  template <class F>
  void exclusive_scan(reco::index_t, F, reco::index_t*) const;
  template <class T>
  void copy_to_host(T*, const T*, reco::index_t) const;
  void synchronize() const;
};
