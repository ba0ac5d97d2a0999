// Tuning variables of the environment (LFM2_MOE_VARIANT and the like): read once where they are
// used, refused in one line when set to something that is not what they take.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace lfm2 {

// `name` as a whole number in [lo, hi]; `fallback` when it is unset or empty. Anything else ("abc",
// "2.5", " 3", out of range) throws lfm2::Error naming the variable, its value and the range.
int64_t env_whole(const char* name, int64_t fallback, int64_t lo, int64_t hi);

// `name` as one of `allowed`; `fallback` when it is unset or empty. Anything else throws lfm2::Error
// naming the variable, its value and the values it takes.
std::string env_choice(const char* name, const char* fallback, std::initializer_list<const char*> allowed);

}  // namespace lfm2
