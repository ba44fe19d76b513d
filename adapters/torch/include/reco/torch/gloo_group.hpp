// A c10d process group over Gloo on this host's loopback, for tests and single-machine runs
// that start their ranks themselves (forked processes and a FileStore). Needs Gloo's headers on
// the include path and USE_C10D_GLOO defined (Debian: libgloo-dev; a PyTorch wheel's LibTorch
// has its own copy).
//
// LibTorch 1.x's ProcessGroupGloo is itself a ProcessGroup; from 2.0 on it is a Backend that a
// ProcessGroup dispatches to, so the group is assembled from the two.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {

inline c10::intrusive_ptr<c10d::ProcessGroup> loopback_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                                  int rank, int world,
                                                                  std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return group;
#else
  return gloo;
#endif
}

}  // namespace torch
RECO_NAMESPACE_END
