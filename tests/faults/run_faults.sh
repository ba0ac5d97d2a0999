#!/usr/bin/env bash
# The fault table's runner (tests/faults/faults.txt, one case a line, fields separated by "@@"):
#
#   name @@ exit @@ seconds @@ flags @@ regex @@ setup @@ command
#
# Each case runs in a fresh directory $W (its working directory): `setup` (bash, may be "-") makes
# what the case needs there; then every file in $W is fingerprinted and `command` runs (bash, under
# `timeout`). The case passes when
#   - the exit code matches `exit` (an extended regex: "1", "3|137"),
#   - it ended within `seconds`,
#   - one line of the output matches `regex` (extended; "-" for none), and, unless the flags say
#     `anyerr`, exactly one line is an error line ("[rank N] error: ..." or "h5pack: error: ...")
#     when it failed, none when it passed,
#   - nothing in the output looks like a crash (terminate called, a fault, a backtrace),
#   - no file of $W or of the shared fixtures changed (flags `changes=NAME` allow one), no
#     temporary file is left anywhere, and no new file appeared in $W (flags `new=NAME`, a glob,
#     allow one; a full-disk case's tmpfs must be empty after a failure).
# Flags: comma-separated; `disk` marks a case that needs a small tmpfs (run through `full SIZE CMD`,
# which mounts one at $W/disk in a private mount namespace: root, or an unprivileged user namespace);
# it is skipped, with the reason, where none can be mounted; `text` marks a case that runs the text
# front end (skipped without its Python modules, except under CI=true).
#
# Commands see: $H (h5pack), $RANK (lfm2-rank), $R1..$R4 (lfm2-rank on 1..4 ranks through mpiexec,
# --device cpu), $MPI (mpiexec with its flags), $FF (tests/faults/fault_files), $F (the shared
# fixtures, made once: never to be changed; textm.h5 carries the text side of $T), $T (the test
# tokenizer's checkpoint files, tests/text/tokenizer), $W.
#
# Prints one line per case and ends with "N passed, N failed, N skipped"; exits 1 if any failed.
set -u

table="" H="" RANK="" FF="" MPIEXEC="mpiexec" WORK="" ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --table) table=$2; shift 2 ;;
    --h5pack) H=$2; shift 2 ;;
    --rank) RANK=$2; shift 2 ;;
    --files) FF=$2; shift 2 ;;
    --mpiexec) MPIEXEC=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;  # a regex of case names (debugging)
    *) echo "run_faults: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$table" ] && [ -n "$H" ] && [ -n "$RANK" ] && [ -n "$FF" ] && [ -n "$WORK" ] ||
  { echo "run_faults: need --table --h5pack --rank --files --work" >&2; exit 2; }

abs() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
table=$(abs "$table") H=$(abs "$H") RANK=$(abs "$RANK") FF=$(abs "$FF") WORK=$(abs "$WORK")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$WORK"
mkdir -p "$WORK/fixtures"
export H RANK FF F="$WORK/fixtures" T="$(cd "$(dirname "$table")/../text/tokenizer" && pwd)"
export MPI="$MPIEXEC --oversubscribe"
for p in 1 2 3 4; do export R$p="$MPI -n $p $RANK --device cpu"; done

# ---- a small tmpfs: root mounts one in a private mount namespace; others try a user namespace.
UNSHARE=""
probe=$WORK/probe-mount
mkdir -p "$probe"
for u in "unshare -m" "unshare -rm"; do
  if $u sh -c "mount -t tmpfs -o size=64k tmpfs '$probe'" 2>/dev/null; then UNSHARE=$u; break; fi
done
disk_reason="no tmpfs can be mounted here (needs root, or unprivileged user namespaces)"
# `text`: a case that runs the text front end (tools/lfm2_text.py), skipped without its modules
# except under CI=true, where scripts/setup.sh has installed them (the case then fails).
text_reason=""
# The interpreter the cases' ranks run the front end with: this one's, by its own path (mpiexec by
# an absolute path puts its bin directory first on the ranks' PATH, where another python3 may be).
LFM2_PYTHON=${LFM2_PYTHON:-$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo python3)}
export LFM2_PYTHON
python3 -c "import tokenizers, jinja2, h5py, numpy" 2>/dev/null ||
  text_reason="no tokenizers / jinja2 / h5py / numpy for the text front end (pip install -r tools/requirements-text.txt)"
[ "${CI:-}" = true ] && text_reason=""
export UNSHARE
# full SIZE CMD...: runs CMD with $W/disk a tmpfs of SIZE; what is left in it goes to $W/disk.left.
full() {
  local size=$1
  shift
  mkdir -p "$W/disk"
  $UNSHARE sh -c 'mount -t tmpfs -o size="$0" tmpfs "$W/disk" || exit 90; "$@"; rc=$?; ls -A "$W/disk" >"$W/disk.left"; exit $rc' \
    "$size" "$@"
}
export -f full

# ---- shared fixtures (errors here fail the whole test: the table cannot run without them).
fix() { "$@" >"$F/.log" 2>&1 || { cat "$F/.log"; echo "run_faults: fixture failed: $*"; exit 1; }; }
(
  cd "$F" || exit 1
  fix "$H" -q synth tiny.h5 --preset lfm2-tiny --seed 11
  fix "$H" -q synth tiny12.h5 --preset lfm2-tiny --seed 12
  fix "$FF" inputs inputs.h5 12 9 512
  fix "$FF" inputs inputs11.h5 11 9 512
  fix "$FF" inputs bad_token.h5 12 9 100000
  fix "$FF" inputs empty_seq.h5 2 0 512
  fix "$FF" inputs too_long.h5 1 4097 512
  fix "$FF" inputs float_ids.h5 12 9 512 float
  fix "$FF" inputs zeros.h5 2 3 1
  fix $R1 --model tiny.h5 --inputs inputs.h5 --output answers.h5
  fix $R1 --model tiny.h5 --inputs inputs11.h5 --output answers11.h5
  fix $R1 --model tiny12.h5 --inputs inputs.h5 --output answers12.h5
  mkdir -p s2 s3 s3b mix old2
  fix "$H" -q split tiny.h5 --stages 2 s2/stage-%d.h5
  fix "$H" -q split tiny.h5 --stages 3 s3/stage-%d.h5
  fix "$H" -q split tiny12.h5 --stages 3 s3b/stage-%d.h5
  cp s3/stage-0.h5 s3/stage-2.h5 mix/ && cp s3b/stage-1.h5 mix/
  fix "$FF" strip tiny.h5 old.h5
  fix "$FF" strip s2/stage-0.h5 old2/stage-0.h5
  fix "$FF" strip s2/stage-1.h5 old2/stage-1.h5
  fix "$FF" poison tiny.h5 nan.h5 layers/3/feed_forward/experts/w1 nan
  fix "$FF" poison tiny.h5 inf_embed.h5 embed_tokens inf
  fix "$FF" poison tiny.h5 inf_head.h5 embedding_norm inf
  fix "$FF" poison tiny.h5 big.h5 layers/0/feed_forward/w2 3e38
  fix "$FF" flip tiny.h5 flip.h5 layers/3/conv/in_proj
  fix "$FF" flip tiny.h5 flip_embed.h5 embed_tokens
  cp tiny.h5 v2.h5 && fix "$FF" attr v2.h5 format_version 2
  cp tiny.h5 notours.h5 && fix "$FF" attr notours.h5 format something-else
  cp tiny.h5 badcfg.h5 && fix "$FF" attr badcfg.h5 config_json '{"num_hidden_layers": 0}'
  cp tiny.h5 dropped.h5 && fix "$FF" drop dropped.h5 layers/2/ffn_norm
  cp tiny.h5 badfp.h5 && fix "$FF" attr badfp.h5 model_fingerprint 0123456789abcdef
  head -c 300000 tiny.h5 >truncated.h5
  echo "not hdf5" >text.txt
  : >empty.h5
  fix "$FF" checkpoint ckpt
  fix "$H" -q synth textm.h5 --preset lfm2-tiny --seed 11 --text "$T"
  printf '{"num_hidden_layers": 2' >broken.json
  echo '{"num_hidden_layers": 0, "hidden_size": 64}' >zero_layers.json
  rm -f .log
) || exit 1
fixture_sums=$(cd "$F" && find . -type f -exec md5sum {} + | sort)

# ---- the cases
pass=0 fail=0 skip=0
crash='terminate called|Segmentation fault|core dumped|Process received signal|Assertion .* failed|Aborted \(|std::bad_alloc|backtrace'
errline='^(\[rank [0-9]+\] |h5pack: )error: '
n=0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in '#'* | '') continue ;; esac
  fields=()
  rest=$line
  while [[ $rest == *@@* ]]; do
    fields+=("${rest%%@@*}")
    rest=${rest#*@@}
  done
  fields+=("$rest")
  if [ ${#fields[@]} != 7 ]; then
    echo "FAIL (table line with ${#fields[@]} fields, not 7): $line"
    fail=$((fail + 1))
    continue
  fi
  trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }
  name=$(trim "${fields[0]}") rc=$(trim "${fields[1]}") secs=$(trim "${fields[2]}") flags=$(trim "${fields[3]}")
  regex=$(trim "${fields[4]}") setup=$(trim "${fields[5]}") cmd=$(trim "${fields[6]}")
  [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]] && continue
  n=$((n + 1))
  if [[ ",$flags," == *,text,* ]] && [ -n "$text_reason" ]; then
    echo "skip $name: $text_reason"
    skip=$((skip + 1))
    continue
  fi
  if [[ ",$flags," == *,disk,* ]] && [ -z "$UNSHARE" ]; then
    echo "skip $name: $disk_reason"
    skip=$((skip + 1))
    continue
  fi
  export W="$WORK/cases/$name"
  rm -rf "$W"
  mkdir -p "$W"
  cd "$W" || exit 1
  if [ "$setup" != "-" ] && ! bash -c "$setup" >"$WORK/setup.log" 2>&1 </dev/null; then
    echo "FAIL $name: setup failed: $(tail -3 "$WORK/setup.log")"
    fail=$((fail + 1))
    continue
  fi
  before=$(find . -type f -exec md5sum {} + | sort)
  t0=$(date +%s.%N)
  out=$(timeout --kill-after=5 "$((${secs%.*} + 30))" bash -c "$cmd" 2>&1 </dev/null)
  got=$?
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  cd "$WORK" || exit 1
  why=""
  [[ $got =~ ^($rc)$ ]] || why="exit $got, expected $rc"
  [ -z "$why" ] && [ "$(echo "$dt > $secs" | bc)" = 1 ] && why="took ${dt}s, bound ${secs}s"
  if [ -z "$why" ] && [ "$regex" != "-" ] && ! grep -Eq -- "$regex" <<<"$out"; then why="no line matches /$regex/"; fi
  if [ -z "$why" ] && [[ ",$flags," != *,anyerr,* ]]; then
    errs=$(grep -Ec -- "$errline" <<<"$out")
    want=1
    [ "$got" = 0 ] && want=0
    [ "$errs" = "$want" ] || why="$errs error lines, expected $want"
  fi
  [ -z "$why" ] && grep -Eq -- "$crash" <<<"$out" && why="crash signature: $(grep -Em1 -- "$crash" <<<"$out")"
  if [ -z "$why" ]; then
    allowed_changes=$(tr ',' '\n' <<<"$flags" | sed -n 's/^changes=//p')
    while read -r sum file; do
      [ -z "$file" ] && continue
      skip_file=0
      for a in $allowed_changes; do [[ ${file#./} == $a ]] && skip_file=1; done
      [ $skip_file = 1 ] && continue
      now=$(md5sum "$W/$file" 2>/dev/null | cut -d' ' -f1)
      [ "$now" = "$sum" ] || { why="input $file was changed or removed"; break; }
    done <<<"$before"
  fi
  if [ -z "$why" ]; then
    left=$(cd "$W" && find . -name '*.tmp.*' | while read -r t; do grep -q " ${t}$" <<<"$before" || echo "$t"; done)
    [ -n "$left" ] && why="temporary file left: $left"
    [ -z "$why" ] && [ -s "$W/disk.left" ] && [[ ",$flags," != *,disk-keeps,* ]] && why="left on the full disk: $(tr '\n' ' ' <"$W/disk.left")"
  fi
  if [ -z "$why" ]; then
    allowed_new=$(tr ',' '\n' <<<"$flags" | sed -n 's/^new=//p')
    while read -r file; do
      [ -z "$file" ] && continue
      grep -q " ${file}$" <<<"$before" && continue
      ok_new=0
      for a in $allowed_new disk.left; do [[ ${file#./} == $a ]] && ok_new=1; done
      [ $ok_new = 1 ] || { why="new file left: $file"; break; }
    done < <(cd "$W" && find . -type f | sort)
  fi
  if [ -z "$why" ]; then
    now_sums=$(cd "$F" && find . -type f -exec md5sum {} + | sort)
    [ "$now_sums" = "$fixture_sums" ] || why="a shared fixture under $F changed"
  fi
  if [ -z "$why" ]; then
    printf 'ok   %-34s exit %-3s %5.1f s\n' "$name" "$got" "$dt"
    pass=$((pass + 1))
  else
    echo "FAIL $name: $why"
    printf '%s\n' "$out" | tail -15 | sed 's/^/      | /'
    fail=$((fail + 1))
  fi
done <"$table"

echo "fault table: $n cases"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
