// Which BLAS kernels this process runs. OpenBLAS picks them by CPU when it loads
// (OPENBLAS_CORETYPE overrides), and kernels of another vector width round the model's products
// differently, so a study's trajectories depend on them (docs/ablation.md, Determinism): the
// report names them, and the cached base policies are keyed by them.
#pragma once

#include <dlfcn.h>

#include <cctype>
#include <string>

namespace ablation {

// OpenBLAS's name for its kernels ("Haswell", "SkylakeX", ...), or "" when the BLAS that
// LibTorch calls is not OpenBLAS (looked up at run time: Debian's LibTorch links the system's).
inline std::string openblas_core() {
  using corename = char* (*)();
  if (auto f = reinterpret_cast<corename>(dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    const char* name = f();
    return name ? name : "";
  }
  return "";
}

// For the report: "OpenBLAS Haswell kernels".
inline std::string blas_kernels() {
  const std::string core = openblas_core();
  return core.empty() ? "a BLAS other than OpenBLAS (or an unnamed OpenBLAS core)" : "OpenBLAS " + core + " kernels";
}

// For file names: "_openblas-haswell", or "" when not OpenBLAS.
inline std::string blas_tag() {
  std::string core = openblas_core();
  if (core.empty()) return "";
  for (char& c : core) c = std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(static_cast<unsigned char>(c))) : '-';
  return "_openblas-" + core;
}

}  // namespace ablation
