# Bounded steps for the device checks (gpu-check.sh, scale-check.sh), sourced
# after setting TAG (the prefix of every line) and LOG (a file every line also
# goes to, or empty).
#   say TEXT...             one line, on stdout and in LOG
#   run NAME SECONDS CMD... one step under `timeout`, its output kept; returns
#                           the command's exit status (124/137 past the limit)
#   keep                    after a failed run: the first failure decides $status
status=0
say() { echo "$TAG: $*"; [ -z "$LOG" ] || echo "$TAG: $*" >> "$LOG"; }
run() {
  local name=$1 limit=$2; shift 2
  say "== $name (at most ${limit}s)"
  local t0=$SECONDS rc
  if [ -n "$LOG" ]; then timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
  else timeout -k 10 "$limit" "$@" 2>&1; rc=$?; fi
  say "-- $name: exit $rc in $((SECONDS - t0))s"
  return "$rc"
}
keep() { local rc=$?; [ "$status" -ne 0 ] || status=$rc; }
