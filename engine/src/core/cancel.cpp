#include "core/cancel.h"

#include "core/error.h"

namespace atelier {

namespace {
thread_local const std::atomic<bool>* t_flag = nullptr;
}

CancelScope::CancelScope(const std::atomic<bool>* flag) : previous_(t_flag) { t_flag = flag; }
CancelScope::~CancelScope() { t_flag = previous_; }

const std::atomic<bool>* current_cancel_flag() { return t_flag; }

bool cancel_requested() { return t_flag && t_flag->load(std::memory_order_relaxed); }

void throw_if_cancelled() {
  if (cancel_requested()) throw Error(StatusCode::Cancelled, "cancelled");
}

}  // namespace atelier
