# Shell helpers the hack/ scripts share; source it, do not run it.

# poll SECONDS COMMAND...: runs COMMAND every 0.5 s until it succeeds (0) or
# SECONDS have passed (1). Its output is discarded.
poll() {
  local secs=$1 i
  shift
  for ((i = 0; i < secs * 2; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}
