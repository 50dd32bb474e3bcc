# Sourced by the e2e scripts that re-exec themselves as PID 1 of a private PID namespace
# (`unshare --pid --fork`). `cleanup_on_exit DIR`: on exit, SIGKILL whatever is left in the
# namespace (kill -1 reaches only its processes, and only when this shell is its PID 1), then
# remove DIR, retrying while a dying process still writes there; the script's exit status
# stands either way (a failed `rm -rf` had turned a passing run into exit 1).
cleanup_on_exit() {
  _CLEANUP_DIR="$1"
  trap '_cleanup_status=$?
    if [ "$$" = 1 ]; then kill -KILL -1 2>/dev/null || true; sleep 0.5; fi
    for _ in 1 2 3 4 5; do rm -rf "$_CLEANUP_DIR" 2>/dev/null && break; sleep 1; done
    exit "$_cleanup_status"' EXIT
}
