# Sourced by the A/B benches (bench/*_ab.sh): the earlier commit's worktree beside this checkout.
#   ab_worktree <name> <earlier-commit> [default rounds] [rounds]
# sets ROOT (this checkout), OLD / NEW (short commits), ROUNDS and TREE (/tmp/<name>-<OLD>: a git
# worktree of OLD using this checkout's .venv; made once, kept for the next A/B).
ab_worktree() {
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  OLD="$(git -C "$ROOT" rev-parse --short "${2:?usage: bench/$(basename "$0") <earlier-commit> [rounds]}")"
  ROUNDS="${4:-$3}"
  NEW="$(git -C "$ROOT" rev-parse --short HEAD)"
  TREE="/tmp/$1-$OLD"
  [ -d "$TREE" ] || git -C "$ROOT" worktree add --detach "$TREE" "$OLD" >/dev/null
  ln -sfn "$ROOT/.venv" "$TREE/.venv"
}
