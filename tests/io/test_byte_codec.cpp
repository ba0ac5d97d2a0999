// common/byte_codec.h: the byte order of the plans, the hub's messages and the journal.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/byte_codec.h"

namespace lfm2 {
namespace {

TEST(ByteCodec, LeastSignificantByteFirst) {
  std::vector<uint8_t> b;
  put_le<uint32_t>(b, 0x01020304u);
  put_le<int32_t>(b, -2);
  put_le<uint8_t>(b, 0xab);
  put_le<float>(b, 1.0f);  // 0x3f800000
  EXPECT_EQ(b, (std::vector<uint8_t>{0x04, 0x03, 0x02, 0x01, 0xfe, 0xff, 0xff, 0xff, 0xab, 0x00, 0x00, 0x80, 0x3f}));
  EXPECT_EQ(read_le<uint32_t>(b.data()), 0x01020304u);
  EXPECT_EQ(read_le<int32_t>(b.data() + 4), -2);
  EXPECT_EQ(read_le<uint16_t>(b.data()), 0x0304u);
}

TEST(ByteCodec, EveryWidthRoundTripsItsExtremes) {
  std::vector<uint8_t> b;
  put_le<int64_t>(b, std::numeric_limits<int64_t>::min());
  put_le<uint64_t>(b, std::numeric_limits<uint64_t>::max() - 1);
  put_le<int32_t>(b, std::numeric_limits<int32_t>::min());
  put_le<int16_t>(b, -300);
  put_le<double>(b, -0.1);
  put_le<double>(b, std::numeric_limits<double>::infinity());
  put_le<float>(b, std::nanf(""));
  ASSERT_EQ(b.size(), size_t(8 + 8 + 4 + 2 + 8 + 8 + 4));
  const uint8_t* p = b.data();
  EXPECT_EQ(take_le<int64_t>(p), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(take_le<uint64_t>(p), std::numeric_limits<uint64_t>::max() - 1);
  EXPECT_EQ(take_le<int32_t>(p), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(take_le<int16_t>(p), -300);
  EXPECT_EQ(take_le<double>(p), -0.1);  // the bits, so exactly
  EXPECT_EQ(take_le<double>(p), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(take_le<float>(p)));
  EXPECT_EQ(p, b.data() + b.size());
}

}  // namespace
}  // namespace lfm2
