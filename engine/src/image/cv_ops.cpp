#include "image/cv_ops.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"

namespace atelier::image::cv {

namespace {

namespace fs = std::filesystem;

struct Module {
  atelier_cv_resize_fn resize = nullptr;
  atelier_cv_orient_fn orient = nullptr;
};

// Opened once, on the first image that needs it, and kept for the process.
// Looked for where the program is installed (<dir of the binary>/../lib/atelier)
// and then in the build tree it was built in.
const Module& module() {
  static std::string error;
  static const Module* m = []() -> const Module* {
    std::vector<fs::path> candidates;
    std::error_code ec;
    if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec && exe.has_parent_path())
      candidates.push_back(exe.parent_path().parent_path() / "lib" / "atelier" / "libatelier_cv.so");
#ifdef ATELIER_BUILD_CV_MODULE
    candidates.emplace_back(ATELIER_BUILD_CV_MODULE);
#endif
    std::string looked;
    for (const fs::path& c : candidates) {
      if (!fs::is_regular_file(c, ec)) {
        looked += (looked.empty() ? "" : ", ") + c.string();
        continue;
      }
      void* lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        const char* why = ::dlerror();
        error = "cannot load " + c.string() + " (" + (why ? why : "dlopen failed") +
                "); install OpenCV's core and imgproc libraries (Debian: libopencv-imgproc406)";
        return nullptr;
      }
      static Module mod;
      mod.resize = reinterpret_cast<atelier_cv_resize_fn>(::dlsym(lib, "atelier_cv_resize"));
      mod.orient = reinterpret_cast<atelier_cv_orient_fn>(::dlsym(lib, "atelier_cv_orient"));
      if (!mod.resize || !mod.orient) {
        error = c.string() + " is not this build's OpenCV module (an entry point is missing); reinstall atelier";
        return nullptr;
      }
      return &mod;
    }
    error = "cannot find libatelier_cv.so, the image-resizing module (looked in " + looked + "); reinstall atelier";
    return nullptr;
  }();
  if (!m) throw IoError(error);
  return *m;
}

}  // namespace

void resize(const void* src, int w, int h, int channels, bool f32, void* dst, int dw, int dh, Interp mode) {
  char err[512] = {};
  if (module().resize(src, w, h, channels, f32 ? 1 : 0, dst, dw, dh, static_cast<int>(mode), err, sizeof err) != 0)
    throw Error(StatusCode::Internal, std::string("resize: ") + err);
}

std::vector<uint8_t> orient(const uint8_t* src, int w, int h, int orientation, int& ow, int& oh) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 3);
  char err[512] = {};
  if (module().orient(src, w, h, orientation, out.data(), &ow, &oh, err, sizeof err) != 0)
    throw Error(StatusCode::Internal, std::string("orientation: ") + err);
  return out;
}

}  // namespace atelier::image::cv
