#include "text/moe.h"

#include "text/llama.h"

namespace atelier::text {

namespace {
// The workspace's arrays in order: router logits (rows x n_expert), gate and
// up (rows * k x n_ff_exp), down (rows * k x n_embd), activations of `act`;
// then ids (int32) and weights (F32), rows * k each. Each 64-byte aligned.
struct Sizes {
  int64_t bytes[6];
};
Sizes sizes(const LlamaHparams& hp, int64_t rows, kernels::DType act) {
  const int64_t slots = rows * hp.n_expert_used;
  return {{kernels::act_bytes(act, rows * hp.n_expert), kernels::act_bytes(act, slots * hp.n_ff_exp),
           kernels::act_bytes(act, slots * hp.n_ff_exp), kernels::act_bytes(act, slots * hp.n_embd),
           slots * int64_t{sizeof(int32_t)}, slots * int64_t{sizeof(float)}}};
}
int64_t round64(int64_t b) { return (b + 63) / 64 * 64; }
}  // namespace

int64_t MoeFfn::workspace_bytes(const LlamaHparams& hp, int64_t rows, kernels::DType act) {
  if (hp.n_expert <= 0) return 0;
  int64_t total = 0;
  for (int64_t b : sizes(hp, rows, act).bytes) total += round64(b);
  return total;
}

void MoeFfn::reserve(const LlamaHparams& hp, int64_t rows) {
  if (rows <= cap_) return;
  cap_ = rows;  // grown to the largest step seen, never shrunk
  const kernels::DType act = be_.act_dtype();
  work_.reset();
  work_ = be_.alloc(workspace_bytes(hp, rows, act));
  be_.clear(*work_);
  const Sizes z = sizes(hp, rows, act);
  int64_t at = 0;
  kernels::Act* acts[] = {&logits_, &gate_, &up_, &down_};
  for (int i = 0; i < 4; ++i) {
    *acts[i] = kernels::Act(work_->at<uint8_t>(at), act);
    at += round64(z.bytes[i]);
  }
  ids_ = work_->at<int32_t>(at);
  at += round64(z.bytes[4]);
  weights_ = work_->at<float>(at);
}

void MoeFfn::forward(const LlamaHparams& hp, const LlamaLayer& L, const MoeVectors& V, kernels::Act xn,
                     kernels::Act out, int64_t rows) {
  reserve(hp, rows);
  const int k = hp.n_expert_used, n_expert = hp.n_expert;
  const int64_t slots = rows * k;
  // The router (llama.cpp: logits = gate_inp x, + bias for gpt-oss), then each row's experts and weights.
  be_.matmul(L.gate_inp, xn, logits_, rows);
  if (V.gate_inp_b) be_.add_bias(logits_, V.gate_inp_b, rows, n_expert);
  kernels::MoeRouting r;
  r.n_expert = n_expert;
  r.k = k;
  r.gating = hp.moe_gating;
  r.norm = hp.moe_norm;
  be_.moe_route(logits_, rows, r, ids_, weights_);
  {
    const kernels::WeightView* sets[] = {L.gate_exps.data(), L.up_exps.data()};
    const kernels::Act ys[] = {gate_, up_};
    const float* bias[] = {V.gate_exps_b, V.up_exps_b};
    be_.matmul_id(sets, ys, bias, 2, n_expert, xn, 1, ids_, rows, k);
  }
  if (hp.moe_swiglu_oai) be_.swiglu_oai(gate_, up_, gate_, slots, hp.n_ff_exp, 1.702f, 7.0f);
  else be_.swiglu(gate_, up_, gate_, slots, hp.n_ff_exp);
  {
    const kernels::WeightView* sets[] = {L.down_exps.data()};
    const kernels::Act ys[] = {down_};
    const float* bias[] = {V.down_exps_b};
    be_.matmul_id(sets, ys, bias, 1, n_expert, gate_, k, ids_, rows, k);
  }
  be_.moe_combine(down_, weights_, out, rows, k, hp.n_embd);
}

}  // namespace atelier::text
