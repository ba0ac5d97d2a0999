#include "model/step_batch.h"

#include "common/error.h"

namespace lfm2 {

bool BatchSeq::operator==(const BatchSeq& o) const {
  return seq == o.seq && slot == o.slot && first_pos == o.first_pos && n_rows == o.n_rows &&
         gen_step == o.gen_step && decode == o.decode;
}

void StepBatch::check(int64_t n_slots, int64_t max_positions) const {
  const int64_t nd = n_decode();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const BatchSeq& s = seqs[i];
    LFM2_CHECK(!s.decode || int64_t(i) < nd, "step batch: decode entry ", i, " (sequence ", s.seq,
               ") after a prompt entry: decode entries come first");
    LFM2_CHECK(s.slot >= 0 && s.slot < n_slots, "step batch: sequence ", s.seq, " in slot ", s.slot, " of ",
               n_slots);
    LFM2_CHECK(s.n_rows >= 1 && (!s.decode || s.n_rows == 1), "step batch: sequence ", s.seq, " has ", s.n_rows,
               s.decode ? " rows in a decode entry" : " rows");
    LFM2_CHECK(s.first_pos >= 0 && int64_t(s.first_pos) + s.n_rows <= max_positions, "step batch: sequence ", s.seq,
               " at positions ", s.first_pos, "..", int64_t(s.first_pos) + s.n_rows - 1, ", past the state's ",
               max_positions);
    LFM2_CHECK(!s.decode || s.first_pos >= 1, "step batch: decode entry of sequence ", s.seq,
               " at position 0 (a decode row follows its prompt)");
    for (size_t j = 0; j < i; ++j)
      LFM2_CHECK(seqs[j].slot != s.slot, "step batch: slot ", s.slot, " twice (sequences ", seqs[j].seq, " and ",
                 s.seq, ")");
  }
}

}  // namespace lfm2
