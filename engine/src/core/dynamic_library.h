// A system library opened at first use rather than linked (libcurl for
// downloads, libcrypto for digests): a linked library is mapped, relocated
// and initialised in every process, whether it uses it or not.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>
#include <type_traits>

namespace atelier {

// The first of NAMES that loads (kept open for the process), or nullptr with
// *why set to the loader's reason.
inline void* open_system_library(std::initializer_list<const char*> names, std::string* why) {
  for (const char* name : names)
    if (void* lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) return lib;
  const char* e = ::dlerror();
  *why = e ? e : std::string(*names.begin()) + " not found";
  return nullptr;
}

// Binds FN to LIB's NAME; false when the library lacks it.
template <class Fn>
bool bind_symbol(void* lib, Fn& fn, const char* name) {
  static_assert(std::is_pointer_v<Fn>);
  fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  return fn != nullptr;
}

}  // namespace atelier
