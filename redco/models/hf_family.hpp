#pragma once
// What a model family contributes to from_pretrained / save_pretrained
// (models/pretrained.hpp): config.json <-> its config struct, the model, and
// where its parameters sit in the checkpoint. Each family specialises it in
// its own header, beside its config and layout, so a new family is one file:
//
//   template <>
//   struct HfFamily<Gpt2> {
//     using Config = Gpt2Config;
//     static Config config(const hf::Config& f);                // config.json -> Config
//     static Gpt2 build(const Config& c);                       // the typed model
//     static hf::Layout layout(const Config& c);                // its checkpoint names
//     static io::Json to_json(const Config& c, io::Json base);  // Config -> config.json
//   };
namespace redco::models {

template <typename M>
struct HfFamily;

}  // namespace redco::models
