# resume_steps.sh (sourced by resume.sh and stream_closed.sh): the steps around a continuous job
# stopped half way. Each prints one line naming what failed and returns nonzero; $1 is the caller's
# name for those lines.
# whole_run WHO LOG FULL COMMAND...: COMMAND --output FULL, uninterrupted (its log printed if it fails).
whole_run() {
  local who=$1 log=$2 full=$3
  shift 3
  "$@" --output "$full" >"$log" 2>&1 || { cat "$log"; echo "$who: the whole run failed"; return 1; }
}
# stopped_state WHO OUT: a stopped job left its journal and partial output, and no output.
stopped_state() {
  local who=$1 out=$2
  [ -s "$out.journal" ] || { echo "$who: no journal after the stop"; return 1; }
  [ -s "$out.partial" ] || { echo "$who: no partial output after the stop"; return 1; }
  [ ! -e "$out" ] || { echo "$who: an output after the stop"; return 1; }
}
# resume_run WHO LOG OUT FULL SAME COMMAND...: COMMAND --output OUT --resume finishes, prints its
# resume line, leaves no journal or partial output, and OUT equals FULL bit for bit (SAME:
# rank_test_files same).
resume_run() {
  local who=$1 log=$2 out=$3 full=$4 same=$5
  shift 5
  "$@" --output "$out" --resume >"$log" 2>&1 || { cat "$log"; echo "$who: the resumed run failed"; return 1; }
  grep -h "resume: " "$log"
  [ ! -e "$out.journal" ] && [ ! -e "$out.partial" ] || { echo "$who: the journal or partial output stayed"; return 1; }
  "$same" same "$full" "$out"
}
