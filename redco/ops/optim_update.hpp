#pragma once
// The coefficients of the optimizers' in-place updates, one step of one
// parameter: what the host computes once per step (learning rate, bias
// corrections, clipping scale) and a backend's update kernel applies to
// every element on the parameter's device (Backend::sgd_update, adam_update).
namespace redco {

// torch.optim.SGD: g = gscale * g + wd * p; b = fresh ? g : momentum * b +
// damp_keep * g; g = nesterov ? g + momentum * b : b; p -= lr * g.
struct SgdCoeffs {
  float lr, gscale, wd, momentum, damp_keep;
  bool nesterov, fresh;
};

// torch.optim.Adam / AdamW: p *= keep (AdamW's decoupled decay); g = gscale *
// g + l2 * p (Adam's L2); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
struct AdamCoeffs {
  float gscale, l2, keep, b1, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps;
};

}  // namespace redco
