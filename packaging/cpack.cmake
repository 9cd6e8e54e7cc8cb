# CPack: `cpack -G DEB` (Debian 12 packages) and `cpack -G TGZ` (the same
# tree as a .tar.gz) from the build folder. Components: `atelier` (every
# install() without a component: the programs, the CV module, the data, the
# desktop files) and, when a CUDA module target exists, `cuda` as the
# separate package atelier-cuda (its module only; see below).
set(CPACK_PACKAGE_NAME atelier)
set(CPACK_PACKAGE_VENDOR "Atelier")
set(CPACK_PACKAGE_CONTACT ${ATELIER_PACKAGE_CONTACT})
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "local text and image generation studio")
set(CPACK_STRIP_FILES ON)
set(CPACK_SOURCE_IGNORE_FILES "/build[^/]*/" "/\\\\.git/")
# The .tar.gz: bin/, lib/, share/ to unpack anywhere (the programs find their data beside bin/);
# the .deb installs under /usr (CPack's default for DEB).
set(CPACK_PACKAGE_FILE_NAME atelier_${PROJECT_VERSION}_${CMAKE_SYSTEM_PROCESSOR})

# The CUDA backend (issue 33) is a module opened at run time, packaged apart
# so the main package needs no CUDA library. With -DATELIER_CUDA=ON the
# target atelier_cuda (a MODULE library, kernels/cuda) goes to lib/atelier/
# in the cuda component.
set(CPACK_COMPONENTS_ALL atelier)
if(TARGET atelier_cuda)
  install(TARGETS atelier_cuda LIBRARY DESTINATION lib/atelier COMPONENT cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
  set(CPACK_DEBIAN_CUDA_PACKAGE_NAME atelier-cuda)
  set(CPACK_DEBIAN_CUDA_FILE_NAME DEB-DEFAULT)
  set(CPACK_DEBIAN_CUDA_PACKAGE_SECTION graphics)
  set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "atelier (= ${PROJECT_VERSION})")
  # The module links cudart statically and libcublasLt.so.13 from NVIDIA's
  # CUDA 13 toolkit or runtime (no Debian 12 package has it), which
  # dpkg-shlibdeps cannot name: the description says what to install.
  set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
  set(CPACK_DEBIAN_CUDA_DESCRIPTION "Atelier's CUDA backend\nRuns Atelier's text models on NVIDIA GPUs (Ampere, Ada, Hopper). Atelier finds the module in /usr/lib/atelier when it starts. Needs the NVIDIA driver (580 or newer) and cuBLASLt 13 (libcublasLt.so.13, NVIDIA's CUDA 13 packages; /usr/local/cuda/lib64 is searched).")
endif()

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_ATELIER_PACKAGE_NAME atelier)
set(CPACK_DEBIAN_ATELIER_FILE_NAME DEB-DEFAULT)  # atelier_VERSION_ARCH.deb
set(CPACK_DEBIAN_ATELIER_PACKAGE_SECTION graphics)
set(CPACK_COMPONENT_ATELIER_DESCRIPTION "Atelier generates text and images on the user's own machine: LLaMA-family
text models from GGUF files and Stable Diffusion 1.x/2.x checkpoints, run
through a durable job queue with continuous batching, from a Qt 6 studio
window (atelier-studio), a command line (atelier) or a local HTTP API
compatible with OpenAI and AUTOMATIC1111 clients (atelier serve). Models
are installed by name into a versioned local model store.")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://atelier-studio.org")
# Libraries the programs link: dpkg-shlibdeps reads them off the binaries (and
# the CV module). Two are opened at run time instead (engine/src/core/dynamic_library.h),
# so no tool sees them: libcurl (model downloads) and libcrypto (sha256).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ATELIER_PACKAGE_DEPENDS "libcurl4 (>= 7.88), libssl3 (>= 3.0)")
# The studio on Xorg or Wayland: Qt's platform plugins come with libqt6gui6;
# its engine monitor draws with OpenGL (Mesa on machines without a GPU driver).
set(CPACK_DEBIAN_ATELIER_PACKAGE_RECOMMENDS "libgl1-mesa-dri, qt6-wayland")
set(CPACK_DEBIAN_ATELIER_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
