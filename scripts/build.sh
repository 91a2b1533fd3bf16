#!/usr/bin/env bash
# Configures (once) and builds dtrain into build/ with Ninja, ccache and precompiled headers. Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
    -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
fi
cmake --build build -j "${DTRAIN_BUILD_JOBS:-2}"
