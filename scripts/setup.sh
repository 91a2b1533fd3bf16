#!/usr/bin/env bash
# Installs what dtrain needs on a fresh Debian 12 machine, and nothing else: Debian packages (compiler tools, OpenMPI,
# Gloo headers, GoogleTest, CLI11, nlohmann-json, toml++, OpenSSL (HMAC for the job secret), ccache, the fortunes
# corpus, libdeflate for checksums) and a project-local virtual environment .venv with libtorch 2.13 (the CPU wheel) and
# Python's safetensors (the export round trip) and matplotlib (the main job's loss curve). Idempotent: a second run
# only checks, in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache pkg-config python3-venv openmpi-bin libopenmpi-dev libgloo-dev
  libgtest-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libssl-dev libdeflate-dev fortunes fortunes-min
  clang-format)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

TORCH_VERSION=2.13.0
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" \
    2>/dev/null; then
  echo "setup: creating .venv with torch==$TORCH_VERSION (CPU build)"
  python3 -m venv .venv
  .venv/bin/pip install -q "torch==$TORCH_VERSION" numpy safetensors matplotlib
fi
# Python's safetensors: the suite loads dtrain's exports with it (tests/export_roundtrip.py)
if ! .venv/bin/python -c "import safetensors" 2>/dev/null; then
  .venv/bin/pip install -q safetensors
fi
# matplotlib: the main job's loss curve (scripts/plot_loss.py)
if ! .venv/bin/python -c "import matplotlib" 2>/dev/null; then
  .venv/bin/pip install -q matplotlib
fi
echo "setup: ready (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), $(mpirun --version | head -1))"
