# Shell functions shared by the hack/build-*.sh scripts (sourced; set log_prefix first).

log() { printf '[%s] %s\n' "${log_prefix:-build}" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# run_build LABEL LOGFILE COMMAND... -> runs a build in the background and reports progress every
# 15 seconds: modules downloaded and packages compiled so far (go build -v names each package;
# once all are compiled, the remaining time is linking).
run_build() {
  local label=$1 logfile=$2 start=$SECONDS next=15 rc=0 compiled downloaded
  shift 2
  "$@" >"$logfile" 2>&1 &
  builder=$!
  while kill -0 "$builder" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - start)) -ge $next ]; then
      compiled=$(grep -cvE '^(go: |#)' "$logfile" || true)
      downloaded=$(grep -c '^go: downloading' "$logfile" || true)
      log "  $label: $((SECONDS - start))s, $downloaded modules downloaded, $compiled packages compiled"
      next=$((next + 15))
    fi
  done
  wait "$builder" || rc=$?
  builder=
  if [ $rc -ne 0 ]; then
    log "building $label failed after $((SECONDS - start))s; last lines of $logfile:"
    tail -n 30 "$logfile" >&2
    exit $rc
  fi
  log "built $label in $((SECONDS - start))s"
}

# go_version MODULE GO_MOD -> the version of MODULE that GO_MOD requires (in a require block or on a
# `require MODULE vX.Y.Z` line); empty when it requires none.
go_version() {
  awk -v module="$1" '$1 == module && $2 ~ /^v/ {print $2; exit}
                      $1 == "require" && $2 == module {print $3; exit}' "$2"
}

# go_module_dir DIR MODULE@VERSION -> the directory of that module in Go's module cache, as `go` run
# in DIR downloads it (a copy of the published module: read-only, its own go.mod beside its files).
go_module_dir() {
  (cd "$1" && go mod download -json "$2" | awk -F'"' '$2 == "Dir" {print $4}')
}

# go_in DIR ARGS... -> runs `go ARGS` in DIR (run_build starts it in a subshell of its own).
go_in() {
  cd "$1"
  shift
  exec go "$@"
}

# install_built NAME... -> moves finished binaries from $staging into $bin.
install_built() {
  local name
  for name in "$@"; do mv -f "$staging/$name" "$bin/$name"; done
}

cleanup() {
  if [ -n "${builder:-}" ]; then kill "$builder" 2>/dev/null || true; fi
  if [ -n "${staging:-}" ]; then rm -rf "$staging"; fi
}

# take_lock FILE WHERE -> one build at a time: holds an exclusive lock on FILE (fd 9) for the rest
# of the script, waiting for a build that holds it; whoever waited re-checks what is missing.
take_lock() {
  exec 9>"$1"
  if ! flock -n 9; then
    log "another build is running in $2; waiting for it"
    flock 9
  fi
}

# claim_release NAME SUBDIR... -> sets root ($GPUPLACE_CACHE/NAME), bin and logs. False when the
# release there is `complete` (its directory printed: the script's whole stdout); true when the
# caller builds it: Go found, bin, logs and each SUBDIR of root made, the build lock held.
claim_release() {
  local cache=${GPUPLACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplace}
  root="$cache/$1"
  shift
  bin="$root/bin"
  logs="$root/logs"
  if complete; then
    echo "$root"
    return 1
  fi
  command -v go >/dev/null || die "go not found on PATH; install Go 1.25 or newer"
  local sub
  mkdir -p "$bin" "$logs"
  for sub in "$@"; do mkdir -p "$root/$sub"; done
  take_lock "$root/.build.lock" "$root"
  if complete; then
    echo "$root"
    return 1
  fi
}

# begin_staging -> $staging, a directory in $bin for binaries being built; removed on exit, so an
# interrupted build never leaves a half-written binary in $bin.
begin_staging() {
  staging=$(mktemp -d "$bin/.staging.XXXXXX")
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}
