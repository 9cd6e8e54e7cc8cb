// libatelier_cv.so: the engine's OpenCV calls behind C entry points (see
// cv_ops.h). Exceptions stop here: OpenCV's become an error message.
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <type_traits>

#include "image/cv_ops.h"

namespace {

int fail(const char* what, char* err, int err_bytes) {
  if (err && err_bytes > 0) std::snprintf(err, static_cast<size_t>(err_bytes), "%s", what);
  return -1;
}

template <class F>
int guarded(F&& f, char* err, int err_bytes) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, err_bytes);
  } catch (...) {
    return fail("OpenCV failed", err, err_bytes);
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int atelier_cv_resize(const void* src, int w, int h, int channels, int f32,
                                                                         void* dst, int dw, int dh, int mode, char* err,
                                                                         int err_bytes) {
  return guarded(
      [&] {
        const int type = CV_MAKETYPE(f32 ? CV_32F : CV_8U, channels);
        const cv::Mat in(h, w, type, const_cast<void*>(src));
        cv::Mat out(dh, dw, type, dst);  // written in place: resize keeps a matrix of the right size and type
        static const int kModes[] = {cv::INTER_AREA, cv::INTER_LINEAR, cv::INTER_CUBIC, cv::INTER_LANCZOS4};
        cv::resize(in, out, cv::Size(dw, dh), 0, 0, kModes[mode]);
        if (out.data != dst) throw std::runtime_error("resize did not write in place");
      },
      err, err_bytes);
}

extern "C" __attribute__((visibility("default"))) int atelier_cv_orient(const uint8_t* src, int w, int h, int orientation,
                                                                         uint8_t* dst, int* ow, int* oh, char* err,
                                                                         int err_bytes) {
  return guarded(
      [&] {
        const cv::Mat m(h, w, CV_8UC3, const_cast<uint8_t*>(src));
        cv::Mat t;
        switch (orientation) {
          case 2: cv::flip(m, t, 1); break;
          case 3: cv::rotate(m, t, cv::ROTATE_180); break;
          case 4: cv::flip(m, t, 0); break;
          case 5: cv::transpose(m, t); break;
          case 6: cv::rotate(m, t, cv::ROTATE_90_CLOCKWISE); break;
          case 7: cv::rotate(m, t, cv::ROTATE_90_COUNTERCLOCKWISE), cv::flip(t, t, 1); break;
          default: cv::rotate(m, t, cv::ROTATE_90_COUNTERCLOCKWISE); break;  // 8
        }
        *ow = t.cols;
        *oh = t.rows;
        std::memcpy(dst, t.data, static_cast<size_t>(t.cols) * t.rows * 3);  // a fresh, continuous matrix
      },
      err, err_bytes);
}

// The definitions above are what cv_ops.cpp looks up by name: their types
// must be the ones it casts to.
static_assert(std::is_same_v<decltype(&atelier_cv_resize), atelier_cv_resize_fn>);
static_assert(std::is_same_v<decltype(&atelier_cv_orient), atelier_cv_orient_fn>);
