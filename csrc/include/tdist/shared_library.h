// RAII handle over dlopen: the CUDA driver and NVSHMEM are loaded at run time, so that the core
// imports on machines without them and says which package is missing instead of failing to link.
#pragma once

#include <string>
#include <vector>

namespace tdist {

// A library opened with dlopen, closed when the handle goes.
class SharedLibrary {
 public:
  // Tries each candidate path in order; throws Error listing every attempt and `install_hint`.
  SharedLibrary(const std::vector<std::string>& candidates, const std::string& install_hint,
                bool global_symbols = false);
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  // The candidate that opened.
  const std::string& path() const { return path_; }

  // Throws Error naming the symbol and the library when it is absent.
  void* symbol(const char* name) const;

  // `fn` = the function `name` (throws as symbol() does).
  template <typename Fn>
  void bind(Fn*& fn, const char* name) const {
    fn = reinterpret_cast<Fn*>(symbol(name));
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace tdist
