# Shared by the tests/qa scripts: run a command as a user would and check
# that bad input gives a clear message and a non-zero exit, never a crash.
# Sourced with SIFT (the sift executable) and WORK (a fresh temporary dir).
set -u
failures=0

# expect STATUS PATTERN CMD...: CMD exits with STATUS (any non-zero when
# STATUS is 'fail') within 60 s, by itself (not a signal), and its stderr
# contains PATTERN (fixed text).
expect ()
{
  want=$1 pattern=$2
  shift 2
  timeout 60 "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  got=$?
  ok=1
  if [ "$got" -ge 124 ]; then
    ok=0 why="killed or timed out (status $got)"
  elif [ "$want" = fail ] && [ "$got" -eq 0 ]; then
    ok=0 why="succeeded"
  elif [ "$want" != fail ] && [ "$got" -ne "$want" ]; then
    ok=0 why="exit status $got, expected $want"
  elif [ -n "$pattern" ] && ! grep -qF -- "$pattern" "$WORK/stderr"; then
    ok=0 why="stderr lacks '$pattern'"
  elif grep -qE 'CRITICAL|ERROR \*\*|AddressSanitizer|runtime error' "$WORK/stderr"; then
    ok=0 why="a GLib critical or sanitizer report"
  fi
  if [ $ok = 1 ]; then
    echo "ok: $*"
  else
    echo "FAIL: $*: $why"
    sed 's/^/  | /' "$WORK/stderr" | head -n 20
    failures=$((failures + 1))
  fi
}

finish ()
{
  rm -rf "$WORK"
  [ $failures -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
  exit 0
}
