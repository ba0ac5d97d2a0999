#include "rank/batching/queue_source.h"

#include <algorithm>

#include "common/error.h"
#include "io/token_files.h"

namespace lfm2 {

QueueSource::QueueSource(JobHub& hub, std::string path, const std::vector<int32_t>& lengths, int64_t seq_len,
                         const std::vector<SeqSettings>& settings, int64_t vocab, int64_t max_positions, int64_t ask)
    : hub_(hub), path_(std::move(path)), lengths_(lengths), seq_len_(seq_len), settings_(settings), vocab_(vocab),
      max_positions_(max_positions), ask_(std::max<int64_t>(ask, 1)) {}

// The granted sequences' prompts: a hyperslab per run of consecutive ones.
void QueueSource::read(const std::vector<int64_t>& seqs) {
  for (size_t a = 0; a < seqs.size();) {
    size_t b = a + 1;
    while (b < seqs.size() && seqs[b] == seqs[b - 1] + 1) ++b;
    const int64_t begin = seqs[a], end = seqs[b - 1] + 1;
    int64_t width = 1;
    for (int64_t s = begin; s < end; ++s) width = std::max<int64_t>(width, length(s));
    TokenInputs in = read_inputs_block(path_, begin, end, width);
    check_inputs(in, vocab_, max_positions_, path_, begin);
    for (int64_t i = 0; i < in.n_seq; ++i) {
      const int64_t s = begin + i;
      const SeqSettings& st = settings_[size_t(s)];
      SeqRequest r;
      r.seq = s;
      r.prompt_len = in.length(i);
      r.max_new_tokens = st.max_new_tokens;
      r.sampling = {st.temperature, st.top_k, st.top_p, st.seed};
      ready_.emplace_back(r, std::vector<int32_t>(in.ids.begin() + i * width, in.ids.begin() + i * width + r.prompt_len));
    }
    a = b;
  }
}

PromptSource::Next QueueSource::next(SeqRequest* request, std::vector<int32_t>* ids) {
  // Refilled once half is used: a read opens the inputs file, and one a prompt cost ~50 us each
  // (16 ms before the first item of 256 prompts).
  if (int64_t(ready_.size()) <= ask_ / 2) read(hub_.take(ask_ - int64_t(ready_.size())));
  if (ready_.empty()) return hub_.more_later() ? Next::kLater : Next::kEnd;
  *request = ready_.front().first;
  *ids = std::move(ready_.front().second);
  ready_.pop_front();
  return Next::kGot;
}

}  // namespace lfm2
