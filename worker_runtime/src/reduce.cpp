#include "reduce.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace muster {

namespace {
uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }
float bits_float(uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

BFloat16::BFloat16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  bits = static_cast<uint16_t>(u >> 16);
}
BFloat16::operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }

Half::Half(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN
    bits = static_cast<uint16_t>(sign | 0x7e00u);
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to 65520 or more: infinity
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    // Scale so that the half's subnormal step (2^-24) is one unit, and let the
    // float adder round to nearest even.
    float scaled = bits_float(abs) + 0.5f;  // 0.5 = 2^-1: ulp of [0.5,1) is 2^-24
    bits = static_cast<uint16_t>(sign | (float_bits(scaled) - 0x3f000000u));
    return;
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xfffu + mant_odd - (112u << 23);  // rebias 127 -> 15, round to nearest even
  bits = static_cast<uint16_t>(sign | (abs >> 13));
}

Half::operator float() const {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -f : f;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

std::size_t element_size(DataType type) {
  switch (type) {
    case DataType::float32: return 4;
    case DataType::float64: return 8;
    case DataType::int32: return 4;
    case DataType::int64: return 8;
    case DataType::bfloat16: return 2;
    case DataType::float16: return 2;
  }
  return 1;
}

const char* data_type_name(DataType type) {
  switch (type) {
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::bfloat16: return "bfloat16";
    case DataType::float16: return "float16";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "?";
}

namespace detail {
namespace {

template <typename T, typename F>
void apply(void* dst, const void* a, const void* b, std::size_t n, F f) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
}

// Integers wrap on overflow (two's complement), as torch's do in practice.
template <typename T>
T add(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  } else {
    return x + y;
  }
}
template <typename T>
T mul(T x, T y) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  } else {
    return x * y;
  }
}

template <typename T>
void combine_native(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: apply<T>(dst, a, b, n, [](T x, T y) { return add(x, y); }); break;
    case ReduceOp::prod: apply<T>(dst, a, b, n, [](T x, T y) { return mul(x, y); }); break;
    case ReduceOp::min: apply<T>(dst, a, b, n, [](T x, T y) { return y < x ? y : x; }); break;
    case ReduceOp::max: apply<T>(dst, a, b, n, [](T x, T y) { return x < y ? y : x; }); break;
  }
}

// 16-bit floats: each step in float, rounded back (as c10::Half's operators do).
template <typename H>
void combine_16(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  auto through_float = [&](auto f) {
    apply<H>(dst, a, b, n, [f](H x, H y) { return H(f(static_cast<float>(x), static_cast<float>(y))); });
  };
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: through_float([](float x, float y) { return x + y; }); break;
    case ReduceOp::prod: through_float([](float x, float y) { return x * y; }); break;
    case ReduceOp::min: through_float([](float x, float y) { return y < x ? y : x; }); break;
    case ReduceOp::max: through_float([](float x, float y) { return x < y ? y : x; }); break;
  }
}

template <typename T>
void divide(void* data, std::size_t n, int divisor) {
  T* d = static_cast<T*>(data);
  const T by = static_cast<T>(divisor);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / by);
}
template <typename H>
void divide_16(void* data, std::size_t n, int divisor) {
  H* d = static_cast<H*>(data);
  const float by = static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) d[i] = H(static_cast<float>(d[i]) / by);
}

}  // namespace

void combine(DataType type, ReduceOp op, void* dst, const void* a, const void* b, std::size_t count) {
  switch (type) {
    case DataType::float32: combine_native<float>(op, dst, a, b, count); break;
    case DataType::float64: combine_native<double>(op, dst, a, b, count); break;
    case DataType::int32: combine_native<int32_t>(op, dst, a, b, count); break;
    case DataType::int64: combine_native<int64_t>(op, dst, a, b, count); break;
    case DataType::bfloat16: combine_16<BFloat16>(op, dst, a, b, count); break;
    case DataType::float16: combine_16<Half>(op, dst, a, b, count); break;
  }
}

void finish(DataType type, ReduceOp op, void* data, std::size_t count, int divisor) {
  if (op != ReduceOp::avg || divisor == 1) return;
  switch (type) {
    case DataType::float32: divide<float>(data, count, divisor); break;
    case DataType::float64: divide<double>(data, count, divisor); break;
    case DataType::int32: divide<int32_t>(data, count, divisor); break;
    case DataType::int64: divide<int64_t>(data, count, divisor); break;
    case DataType::bfloat16: divide_16<BFloat16>(data, count, divisor); break;
    case DataType::float16: divide_16<Half>(data, count, divisor); break;
  }
}

}  // namespace detail
}  // namespace muster
