// common/env.h: tuning variables as whole numbers, bad values refused in one line naming them.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "common/env.h"
#include "common/error.h"

namespace lfm2 {
namespace {

constexpr const char* kName = "LFM2_TEST_ENV_WHOLE";

TEST(EnvWhole, UnsetOrEmptyIsTheFallback) {
  unsetenv(kName);
  EXPECT_EQ(env_whole(kName, 2048, 0, 1 << 20), 2048);
  setenv(kName, "", 1);
  EXPECT_EQ(env_whole(kName, 7, 0, 12), 7);
  unsetenv(kName);
}

TEST(EnvWhole, ValuesInRange) {
  setenv(kName, "0", 1);
  EXPECT_EQ(env_whole(kName, 2048, 0, 1 << 20), 0);
  setenv(kName, "1048576", 1);
  EXPECT_EQ(env_whole(kName, 2048, 0, 1 << 20), 1 << 20);
  setenv(kName, "-1", 1);
  EXPECT_EQ(env_whole(kName, 0, -1, 3), -1);
  unsetenv(kName);
}

TEST(EnvWhole, BadValuesNameTheVariable) {
  for (const char* bad : {"abc", "2.5", " 3", "3 ", "+", "-", "12x", "1048577", "-1", "99999999999999999999"}) {
    setenv(kName, bad, 1);
    try {
      env_whole(kName, 2048, 0, 1 << 20);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(kName) + "='" + bad + "': not a whole number in [0, 1048576]"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
  unsetenv(kName);
}

TEST(EnvChoice, UnsetEmptyOrAllowed) {
  unsetenv(kName);
  EXPECT_EQ(env_choice(kName, "32", {"16", "32"}), "32");
  setenv(kName, "", 1);
  EXPECT_EQ(env_choice(kName, "1", {"0", "1"}), "1");
  setenv(kName, "16", 1);
  EXPECT_EQ(env_choice(kName, "32", {"16", "32"}), "16");
  setenv(kName, "cutlass", 1);
  EXPECT_EQ(env_choice(kName, "cublaslt", {"cublaslt", "cutlass"}), "cutlass");
  unsetenv(kName);
}

TEST(EnvChoice, OtherValuesNameTheVariableAndTheChoices) {
  for (const char* bad : {"8", "16 ", "true", "CUTLASS", "01"}) {
    setenv(kName, bad, 1);
    try {
      env_choice(kName, "32", {"16", "32"});
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(kName) + "='" + bad + "': not one of 16, 32"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
  unsetenv(kName);
}

}  // namespace
}  // namespace lfm2
