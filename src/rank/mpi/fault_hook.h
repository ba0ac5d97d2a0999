// The test hook of lfm2-rank: LFM2_TEST_KILL="RANK:PHASE[:stop]" makes rank RANK raise SIGKILL (or
// SIGSTOP with ":stop": it stalls without dying) on reaching PHASE, to prove that no rank waits
// forever and that nothing is left behind. PHASE is one of
//   init       before MPI_Init (the others wait for it to join the job)
//   loading    before loading its stage's weights
//   agreement  before the ready agreement that ends start-up
//   output     before the results are reported and written (after the exchange)
//   <m>        after finishing microbatch m (Pipeline::set_kill_after, set up in startup/load_phase.cpp)
// Tests only (tests/rank, tests/faults); unset it does nothing.
#pragma once

namespace lfm2 {

// Raises the signal when LFM2_TEST_KILL names this rank and `phase`.
void fault_point(int rank, const char* phase);

}  // namespace lfm2
