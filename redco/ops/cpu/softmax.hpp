#pragma once
// Softmax, log-softmax and cross entropy over the last dimension of [N, D].
#include <cstdint>

namespace redco::cpu {

void softmax_forward(const float* x, float* y, int64_t N, int64_t D);
// dx = y * (dy - sum(dy * y))
void softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D);
void log_softmax_forward(const float* x, float* y, int64_t N, int64_t D);
// dx = dy - exp(y) * sum(dy)
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D);

// losses[n] = logsumexp(logits[n]) - logits[n, labels[n]]; lse[n] saved for backward.
// Rows whose label == ignore_index get loss 0. A label outside [0, V) that is
// not ignore_index throws redco::Error naming the row and the label.
void cross_entropy_forward(const float* logits, const int64_t* labels, float* losses, float* lse,
                           int64_t N, int64_t V, int64_t ignore_index);
// dlogits[n] = dlosses[n] * (softmax(logits[n]) - onehot(labels[n])); ignored rows get 0.
void cross_entropy_backward(const float* logits, const int64_t* labels, const float* lse,
                            const float* dlosses, float* dlogits, int64_t N, int64_t V,
                            int64_t ignore_index);

}  // namespace redco::cpu
