#pragma once
// Reader for the IDX format (LeCun's MNIST container), plain or gzip-compressed.
// Kept free of redco's Tensor so the data group builds and tests on its own;
// callers wrap the returned vectors in whatever container they use.
//
// Layout: bytes 00 00 <type code> <ndims>, then ndims big-endian u32 sizes,
// then the elements row-major, big-endian.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace redco::data {

enum class IdxType : uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

std::string_view idx_type_name(IdxType t);
size_t idx_type_size(IdxType t);

// One IDX array, converted to host byte order. `data` holds the vector whose
// element type matches `type`.
struct IdxArray {
  using Storage = std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<int16_t>,
                               std::vector<int32_t>, std::vector<float>, std::vector<double>>;

  std::string path;  // where it was read from, for error messages
  IdxType type = IdxType::u8;
  std::vector<int64_t> shape;
  Storage data;

  int64_t numel() const;

  // The elements as T; throws redco::Error naming the file when T is not the
  // stored type (use to_float() to convert instead).
  template <typename T>
  const std::vector<T>& values() const {
    if (const auto* v = std::get_if<std::vector<T>>(&data)) return *v;
    fail_wrong_type(stored_name<T>());
  }

  // Every element converted to float, whatever the stored type.
  std::vector<float> to_float() const;

 private:
  template <typename T>
  static std::string_view stored_name();
  [[noreturn]] void fail_wrong_type(std::string_view requested) const;
};

template <typename T>
std::string_view IdxArray::stored_name() {
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  if constexpr (std::is_same_v<T, int8_t>) return "i8";
  if constexpr (std::is_same_v<T, int16_t>) return "i16";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  return "an unsupported type";
}

// Reads an IDX file; gzip compression is detected from the 1f 8b magic.
// Throws redco::Error naming `path` when the file is missing, unreadable,
// not IDX, truncated or followed by extra bytes.
IdxArray read_idx(const std::string& path);

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct FashionMnist {
  int64_t count = 0;  // N
  int64_t rows = 28, cols = 28;
  std::vector<float> images;    // [N, rows, cols], pixel / 255 in [0, 1]
  std::vector<int64_t> labels;  // [N], class ids 0..9
};

// Loads split "train" (60000 images) or "test" (10000) from `dir`, which holds
// the files as shipped (train-images-idx3-ubyte.gz ...; uncompressed names work too).
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir,
                                const std::string& split = "train");

}  // namespace redco::data
