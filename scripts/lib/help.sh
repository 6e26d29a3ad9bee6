# Sourced first by every script in scripts/: with -h or --help the script
# prints the comment at its top (what it does and how to call it) and exits 0
# before anything else runs.
case "${1:-}" in
  -h | --help)
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
    ;;
esac
