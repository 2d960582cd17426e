#include "tdist/shared_library.h"

#include <dlfcn.h>

#include "tdist/error.h"

namespace tdist {

SharedLibrary::SharedLibrary(const std::vector<std::string>& candidates,
                             const std::string& install_hint, bool global_symbols) {
  std::string attempts;
  const int mode = RTLD_NOW | (global_symbols ? RTLD_GLOBAL : RTLD_LOCAL);
  for (const auto& candidate : candidates) {
    handle_ = dlopen(candidate.c_str(), mode);
    if (handle_ != nullptr) {
      path_ = candidate;
      return;
    }
    const char* why = dlerror();
    attempts += "\n  " + candidate + ": " + (why ? why : "not found");
  }
  TDIST_FAIL(-1, "load_library", "could not load any of:" << attempts << "\n" << install_hint);
}

SharedLibrary::~SharedLibrary() {
  // Never dlclose: libraries such as NVSHMEM register atexit handlers and CUDA callbacks that
  // would point into unmapped code after an unload.
}

void* SharedLibrary::symbol(const char* name) const {
  dlerror();
  void* sym = dlsym(handle_, name);
  TDIST_CHECK(sym != nullptr, -1, "load_library",
              "symbol " << name << " is missing from " << path_
                        << "; the installed library is too old or not the expected one");
  return sym;
}

}  // namespace tdist
