// Forked ranks for the multi-process LibTorch tests (a c10d FileStore path per call).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

namespace torch_test {

// Forks `world` processes running body(rank, group_path); each is killed by alarm after
// `seconds`; returns the exit codes (128 + signal for a killed one).
template <class Body>
std::vector<int> spawn(int world, int seconds, Body body) {
  char dir[] = "/tmp/reco_ranks_XXXXXX";
  const std::string path = std::string(mkdtemp(dir)) + "/store";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(seconds));
      // A write to the socket of a rank that died must fail with EPIPE, which Gloo turns into
      // the process group's error, not end this rank by SIGPIPE (the default for a C++ program;
      // a Python process ignores SIGPIPE from its start, so torch.distributed never sees it).
      std::signal(SIGPIPE, SIG_IGN);
      // One intra-op thread per rank: an OpenMP thread team the parent already started does not
      // survive fork, and the LibTorch of a PyTorch 2.x wheel then hangs in the child's first
      // parallel region (the ranks share the machine's cores anyway).
      at::set_num_threads(1);
      int code = 1;
      try {
        code = body(r, path);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  std::remove(path.c_str());
  rmdir(std::string(dir).c_str());
  return codes;
}

}  // namespace torch_test
