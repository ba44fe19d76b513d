#!/usr/bin/env bash
# Installs the Debian packages reco's builds need, only those missing. Idempotent; runs as root
# (or through sudo when available). Usage: scripts/install_deps.sh [package ...]
set -euo pipefail

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  # LibTorch comes from the PyPI torch wheel of scripts/test.sh's environment (the study's
  # scripts/reproduce.sh installs Debian's libtorch-dev itself).
  wanted=(cmake g++ make ninja-build ccache libgloo-dev libgtest-dev libbenchmark-dev
          python3-venv python3-pip
          # reco::blas, the GEMMs of linear_logp_entropy: OpenBLAS, its OpenMP build (LibTorch's libgomp)
          libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev)
fi
missing=()
for p in "${wanted[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[deps] all present: ${wanted[*]}"
  exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "[deps] need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "[deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
