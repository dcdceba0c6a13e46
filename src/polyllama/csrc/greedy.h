// The token llama_sampler_init_greedy would pick, without building its n_vocab-long
// candidate array: with a 128k vocabulary a scalar scan took 38 µs per token on our build
// machine, 4% of the ~1 ms an H100 needs to decode a token of a 1B model.
#pragma once

#include <limits>

namespace polyllama {

// The first index of the largest number in p[begin..end) that is above -inf (NaN never
// wins), and that number; index -1 when there is none. A scan cut into ranges gives the
// whole scan's answer by argmax_merge over the ranges in ascending order.
struct argmax_part {
    int   index = -1;
    float value = 0.0f;
};
argmax_part argmax_range(const float * p, int begin, int end) noexcept;

// `into` followed by the later range `next`: the larger, the earlier one on a tie
inline void argmax_merge(argmax_part & into, const argmax_part & next) noexcept {
    if (next.index >= 0 && (into.index < 0 || next.value > into.value)) {
        into = next;
    }
}

// While it lives, p[token] is the lowest float, so that no scan of p picks it; restored
// when it goes. token -1 (or outside [0, n)): nothing is changed.
class excluded_logit {
  public:
    excluded_logit(float * p, int n, int token) noexcept
        : at_(token >= 0 && token < n ? p + token : nullptr) {
        if (at_ != nullptr) {
            saved_ = *at_;
            *at_ = -std::numeric_limits<float>::max();
        }
    }
    ~excluded_logit() {
        if (at_ != nullptr) {
            *at_ = saved_;
        }
    }
    excluded_logit(const excluded_logit &) = delete;
    excluded_logit & operator=(const excluded_logit &) = delete;

  private:
    float * at_;
    float   saved_ = 0.0f;
};

// argmax_range over all of p, never `exclude` (-1: none; see excluded_logit); 0 when no
// number is above -inf.
int argmax_f32(float * p, int n, int exclude) noexcept;

}  // namespace polyllama
