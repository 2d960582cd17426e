// A loaded module's PTX, as far as module set-up needs it: which globals the module declares.
// Looking up a global that a module lacks fails with CUDA_ERROR_NOT_FOUND, and compute-sanitizer
// reports every such failure as an API error, so set-up asks the PTX first and looks up only the
// globals it names.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace tdist {

// What module set-up knows of a module's code: its PTX text, or nothing (file notes).
class ModulePtx {
 public:
  // The PTX at `path` (Triton's cached copy of the module's code); unknown when `path` is empty or
  // unreadable, and then every global may be declared.
  static ModulePtx from_file(const std::string& path) {
    if (path.empty()) return ModulePtx();
    std::ifstream file(path, std::ios::binary);
    if (!file) return ModulePtx();
    std::ostringstream text;
    text << file.rdbuf();
    return ModulePtx(text.str());
  }

  // Unknown code: every global may be declared.
  ModulePtx() = default;
  // Known code: `text` is the module's PTX.
  explicit ModulePtx(std::string text) : text_(std::move(text)) {}

  // False only when the PTX is known and never names `global` (as a whole identifier: not
  // inside a longer name).
  bool may_declare(std::string_view global) const {
    if (!text_) return true;
    for (std::size_t at = text_->find(global); at != std::string::npos; at = text_->find(global, at + 1)) {
      const std::size_t end = at + global.size();
      if ((at == 0 || !identifier_char((*text_)[at - 1])) &&
          (end == text_->size() || !identifier_char((*text_)[end]))) {
        return true;
      }
    }
    return false;
  }

 private:
  // PTX identifiers: letters, digits, _ and $.
  static bool identifier_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
  }

  std::optional<std::string> text_;
};

}  // namespace tdist
