#pragma once
// A Vision Transformer's input (Dosovitskiy et al., 2020): the image cut into
// patch x patch squares, each projected to `dim` features (a convolution with
// stride = kernel = patch, i.e. one linear map over each flattened patch), a
// learned class token put first, and learned position embeddings added.
// images [N, C, H, W] f32 -> [N, 1 + (H / patch) * (W / patch), dim], patches
// in row-major order (transformers' ViTEmbeddings without masking or
// position interpolation: the image must have the configured size).
//
// Tensor-parallel: every parameter is replicated. The two rules cover chains
// of fully-connected layers and attention; the projection here feeds a
// residual stream that must be whole (the first block's norm), so splitting
// it would only add a gather, for well under 1% of a ViT's weights.
#include "redco/nn/combinators.hpp"

namespace redco::nn {

struct PatchEmbedding {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "embeddings";
  int64_t channels = 3, height = 224, width = 224, patch = 16, dim = 0;

  int64_t patches() const { return (height / patch) * (width / patch); }
  static constexpr void walk(Walker& w, const PatchEmbedding* l) {
    w.need_whole();
    const int64_t c = l ? l->channels : 0, p = l ? l->patch : 0, d = l ? l->dim : 0;
    w.param("patch_embeddings.projection.weight", Role::replicated, l ? Dims{d, c, p, p} : Dims{},
            Init::normal, l ? 1.f / std::sqrt(float(c * p * p)) : 0.f);
    w.param("patch_embeddings.projection.bias", Role::replicated, l ? Dims{d} : Dims{},
            Init::zeros);
    w.param("cls_token", Role::replicated, l ? Dims{1, 1, d} : Dims{}, Init::normal,
            kTransformerInitStd);
    w.param("position_embeddings", Role::replicated, l ? Dims{1, 1 + l->patches(), d} : Dims{},
            Init::normal, kTransformerInitStd);
  }
  Tensor forward(const Params& p, const Tensor& images, Ctx& ctx) const {
    const Tensor x = whole_features(images, ctx);
    REDCO_CHECK(x.rank() == 4 && x.dim(1) == channels && x.dim(2) == height && x.dim(3) == width,
                "patch embedding: expected images [N, {}, {}, {}] (the config's num_channels and "
                "image_size), got {}",
                channels, height, width, x.shape());
    REDCO_CHECK(x.dtype() == p["cls_token"].dtype(),
                "patch embedding: images are {} but the model is {}: convert the pixels",
                dtype_name(x.dtype()), dtype_name(p["cls_token"].dtype()));
    const int64_t n = x.dim(0);
    // [N, dim, H/patch, W/patch] -> [N, patches, dim]
    const Tensor y = conv2d(x, p["patch_embeddings.projection.weight"],
                            p["patch_embeddings.projection.bias"], patch, 0);
    const Tensor tokens = transpose(reshape(y, {n, dim, patches()}), 1, 2);
    const Tensor h = concat({broadcast_to(p["cls_token"], {n, 1, dim}), tokens}, 1);
    return add(h, broadcast_to(p["position_embeddings"], h.shape()));
  }
};

// images of channels x height x width in patch x patch squares; height and
// width must be multiples of patch.
inline PatchEmbedding patch_embedding(int64_t channels, int64_t height, int64_t width,
                                      int64_t patch, int64_t dim) {
  REDCO_CHECK(patch > 0 && height > 0 && width > 0 && height % patch == 0 && width % patch == 0,
              "patch embedding: image {}x{} must be a whole number of {}x{} patches", height, width,
              patch, patch);
  return {.channels = channels, .height = height, .width = width, .patch = patch, .dim = dim};
}

}  // namespace redco::nn
