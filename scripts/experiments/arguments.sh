# Sourced by the study drivers (`. "$(dirname "$0")/arguments.sh"` before anything else): their usage is the comment
# block at the top of the calling script, -h/--help prints it, and a wrong argument dies with it (exit 2).
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }  # the caller's comment
die() { echo "$(basename "$0"): $*" >&2; usage >&2; exit 2; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
