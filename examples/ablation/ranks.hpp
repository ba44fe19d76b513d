// Data-parallel ranks of one training job (--ranks N): the job's process forks N - 1 copies of
// itself, and the N processes join a c10d ProcessGroupGloo on 127.0.0.1 through a FileStore in a
// fresh temporary directory. Rank 0 is the process that forked; it owns the children and reaps
// them (or, when it leaves early, terminates them). See docs/ablation.md ("Data-parallel ranks").
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#ifdef RECO_ABLATION_RANKS
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include "reco/torch/gloo_group.hpp"
#endif

namespace ablation {

// Whether this build can run several ranks (Gloo's headers were found at configure time).
inline constexpr bool ranks_available() {
#ifdef RECO_ABLATION_RANKS
  return true;
#else
  return false;
#endif
}

class rank_set {
 public:
  rank_set() = default;
  rank_set(const rank_set&) = delete;
  rank_set& operator=(const rank_set&) = delete;
  ~rank_set() {
    // Rank 0 leaving without join() (an exception): the children must not outlive it.
    for (pid_t pid : children_) kill(pid, SIGTERM);
    for (pid_t pid : children_) waitpid(pid, nullptr, 0);
    remove_store();
  }

  int rank() const { return rank_; }
  int world() const { return world_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

  // Forks world - 1 processes and joins all of them to one Gloo group; returns in every process
  // (check rank()). Call before LibTorch has started any thread: fork() copies only the calling
  // thread. A collective that waits longer than `timeout` fails (a rank that died).
  void start(int world, std::chrono::milliseconds timeout) {
    if (world <= 1) return;
#ifdef RECO_ABLATION_RANKS
    const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "reco_ablation_XXXXXX";
    std::string pattern = tmp.string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("--ranks: cannot create a temporary directory");
    dir_ = pattern;
    world_ = world;
    const pid_t parent = getpid();
    for (int r = 1; r < world; ++r) {
      const pid_t pid = fork();
      if (pid < 0) throw std::runtime_error("--ranks: fork failed");
      if (pid == 0) {
        // A child dies with its rank 0 (its collectives would only time out otherwise).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(3);
        rank_ = r;
        children_.clear();
        dir_.clear();  // rank 0 removes it
        break;
      }
      children_.push_back(pid);
    }
    auto store = c10::make_intrusive<c10d::FileStore>(pattern + "/store", world);
    group_ = reco::torch::loopback_gloo_group(store, rank_, world, timeout);
#else
    (void)timeout;
    throw std::runtime_error("--ranks > 1 needs a build with Gloo's headers (Debian: libgloo-dev)");
#endif
  }

  // Rank 0: waits for the other ranks and removes the store; returns how many of them failed.
  int join() {
    int failed = 0;
    for (pid_t pid : children_) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    children_.clear();
    group_.reset();
    remove_store();
    return failed;
  }

 private:
  void remove_store() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  int rank_ = 0, world_ = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<pid_t> children_;
  std::string dir_;
};

}  // namespace ablation
