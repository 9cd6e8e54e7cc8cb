// Cooperative cancellation of long model calls (issue 35): a thread that runs
// cancellable work installs a flag with CancelScope; the networks call
// throw_if_cancelled() between their blocks, and the engine's ThreadPool,
// called from that thread, runs its loops in short slices and skips what is
// left of a loop once the flag is set. So a UNet call on a huge latent stops
// within a slice (tens of ms) rather than at the end of the step. The flag
// is per thread, not a parameter, so that no op or network signature changes.
#pragma once

#include <atomic>

namespace atelier {

// Installs FLAG as the calling thread's cancel flag until destroyed (the
// previous one is restored). nullptr: nothing here is cancellable.
class CancelScope {
 public:
  explicit CancelScope(const std::atomic<bool>* flag);
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

// The calling thread's flag (nullptr when none is installed).
const std::atomic<bool>* current_cancel_flag();
// True when the calling thread's flag is set.
bool cancel_requested();
// Throws Error(StatusCode::Cancelled) when the calling thread's flag is set:
// the cancellation point the networks call between their blocks.
void throw_if_cancelled();

}  // namespace atelier
