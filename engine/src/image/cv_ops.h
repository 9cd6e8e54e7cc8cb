// OpenCV behind a module: the calls the engine makes into OpenCV (resize,
// EXIF orientation) are compiled into libatelier_cv.so (cv_module.cpp, the
// one file that includes OpenCV), which cv_ops.cpp opens on first use. A
// text run then never maps OpenCV and the GL, X11, LAPACK, Fortran and TBB
// libraries Debian's build of it brings (about 4 MB resident). The boundary
// is plain C, so the module and the engine share no C++ ABI.
#pragma once

#include <cstdint>
#include <vector>

namespace atelier::image::cv {

enum class Interp { area = 0, linear = 1, cubic = 2, lanczos4 = 3 };

// SRC: H rows of W pixels of CHANNELS values, 8-bit (f32 false) or float,
// continuous; DST: DH rows of DW pixels, the same kind. Throws Error when the
// module cannot be loaded or OpenCV refuses.
void resize(const void* src, int w, int h, int channels, bool f32, void* dst, int dw, int dh, Interp mode);

// The 8-bit RGB image SRC (W x H) turned upright for EXIF orientation 2..8;
// its size in OW, OH.
std::vector<uint8_t> orient(const uint8_t* src, int w, int h, int orientation, int& ow, int& oh);

}  // namespace atelier::image::cv

// The module's entry points (C linkage): 0 on success, else -1 with OpenCV's
// message in ERR (at most ERR_BYTES, NUL-terminated).
extern "C" {
using atelier_cv_resize_fn = int (*)(const void* src, int w, int h, int channels, int f32, void* dst, int dw, int dh,
                                     int mode, char* err, int err_bytes);
using atelier_cv_orient_fn = int (*)(const uint8_t* src, int w, int h, int orientation, uint8_t* dst, int* ow, int* oh,
                                     char* err, int err_bytes);
}
