// dtrain::init(): the one call a program makes to join its job (see comm/factory.h for the details).
#pragma once

#include "comm/factory.h"

namespace dtrain {

// Reads the environment of `dtrain run`, torchrun, mpirun or srun, chooses the backend, and returns the world
// group.
inline comm::BackendPtr init(const comm::InitOptions& opts = {}) { return comm::init(opts); }

}  // namespace dtrain
