// libmuster's reduction kernels and 16-bit float conversions.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../../worker_runtime/src/reduce.hpp"

using muster::BFloat16;
using muster::DataType;
using muster::Half;
using muster::ReduceOp;

namespace {
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

TEST_CASE("Half round-trips every finite binary16 value exactly") {
  int finite = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    Half x;
    x.bits = static_cast<uint16_t>(h);
    float f = static_cast<float>(x);
    if (std::isnan(f)) {
      CHECK(((h >> 10) & 0x1f) == 0x1f);
      continue;
    }
    ++finite;
    REQUIRE(Half(f).bits == h);
  }
  CHECK(finite == 0x10000 - 2 * 1023);
}

TEST_CASE("Half rounds to nearest even, overflows to infinity, keeps subnormals") {
  CHECK(static_cast<float>(Half(1.0f)) == 1.0f);
  CHECK(Half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // halfway: stays even
  CHECK(Half(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);  // halfway: rounds up to even
  CHECK(Half(65504.0f).bits == 0x7bff);
  CHECK(Half(65520.0f).bits == 0x7c00);
  CHECK(Half(-1e10f).bits == 0xfc00);
  CHECK(Half(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(Half(std::ldexp(1.0f, -25)).bits == 0x0000);  // halfway to the smallest subnormal: even (zero)
  CHECK(Half(std::ldexp(3.0f, -25)).bits == 0x0002);
  CHECK(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("BFloat16 truncates float's mantissa with round-to-nearest-even") {
  CHECK(BFloat16(1.0f).bits == 0x3f80);
  CHECK(BFloat16(from_bits(0x3f808000)).bits == 0x3f80);  // halfway, even stays
  CHECK(BFloat16(from_bits(0x3f818000)).bits == 0x3f82);  // halfway, odd rounds up
  CHECK(BFloat16(from_bits(0x3f808001)).bits == 0x3f81);
  CHECK(static_cast<float>(BFloat16(-2.5f)) == -2.5f);
  CHECK(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bits(static_cast<float>(BFloat16(3.0f))) == 0x40400000u);
}

TEST_CASE("combine applies each op element-wise for every dtype") {
  std::vector<float> a{1, -2, 3, 4}, b{5, 6, -7, 0.5f}, d(4);
  muster::detail::combine(DataType::float32, ReduceOp::sum, d.data(), a.data(), b.data(), 4);
  CHECK(d == std::vector<float>{6, 4, -4, 4.5f});
  muster::detail::combine(DataType::float32, ReduceOp::min, d.data(), a.data(), b.data(), 4);
  CHECK(d == std::vector<float>{1, -2, -7, 0.5f});
  muster::detail::combine(DataType::float32, ReduceOp::max, d.data(), a.data(), b.data(), 4);
  CHECK(d == std::vector<float>{5, 6, 3, 4});
  muster::detail::combine(DataType::float32, ReduceOp::prod, d.data(), a.data(), b.data(), 4);
  CHECK(d == std::vector<float>{5, -12, -21, 2});

  std::vector<int32_t> x{INT32_MAX, 7, -9}, y{1, 2, 4};
  muster::detail::combine(DataType::int32, ReduceOp::sum, x.data(), x.data(), y.data(), 3);
  CHECK(x == std::vector<int32_t>{INT32_MIN, 9, -5});  // wraps like two's complement
  muster::detail::finish(DataType::int32, ReduceOp::avg, x.data(), 3, 2);
  CHECK(x[1] == 4);
  CHECK(x[2] == -2);  // truncates toward zero

  std::vector<int64_t> p{3, -4}, q{5, 6};
  muster::detail::combine(DataType::int64, ReduceOp::prod, p.data(), p.data(), q.data(), 2);
  CHECK(p == std::vector<int64_t>{15, -24});

  std::vector<double> u{1.5, 2.5};
  muster::detail::finish(DataType::float64, ReduceOp::avg, u.data(), 2, 2);
  CHECK(u == std::vector<double>{0.75, 1.25});
  muster::detail::finish(DataType::float64, ReduceOp::sum, u.data(), 2, 2);
  CHECK(u == std::vector<double>{0.75, 1.25});

  std::vector<Half> h{Half(1.5f), Half(-2.0f)}, k{Half(2.25f), Half(0.5f)};
  muster::detail::combine(DataType::float16, ReduceOp::sum, h.data(), h.data(), k.data(), 2);
  CHECK(static_cast<float>(h[0]) == 3.75f);
  CHECK(static_cast<float>(h[1]) == -1.5f);
  muster::detail::finish(DataType::float16, ReduceOp::avg, h.data(), 2, 3);
  CHECK(static_cast<float>(h[0]) == static_cast<float>(Half(1.25f)));

  std::vector<BFloat16> e{BFloat16(8.0f)}, f{BFloat16(-3.0f)};
  muster::detail::combine(DataType::bfloat16, ReduceOp::max, e.data(), e.data(), f.data(), 1);
  CHECK(static_cast<float>(e[0]) == 8.0f);
  muster::detail::combine(DataType::bfloat16, ReduceOp::prod, e.data(), e.data(), f.data(), 1);
  CHECK(static_cast<float>(e[0]) == -24.0f);
}

TEST_CASE("element sizes and names") {
  CHECK(muster::element_size(DataType::bfloat16) == 2);
  CHECK(muster::element_size(DataType::int64) == 8);
  CHECK(std::string(muster::data_type_name(DataType::float16)) == "float16");
  CHECK(std::string(muster::reduce_op_name(ReduceOp::avg)) == "avg");
}
