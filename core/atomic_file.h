// A small text file written whole or not at all: profiles and other files users keep.
#pragma once

#include <string>

namespace dtrain {

// Writes `text` to a temporary file beside `path`, syncs it, renames it over `path` and syncs the folder:
// a reader sees the old content or the new, never a part. ValueError naming `what` (e.g. "profile"), the
// path and the system's reason; the previous file, if any, is then unchanged.
void write_text_atomic(const std::string& what, const std::string& path, const std::string& text);

}  // namespace dtrain
