#!/usr/bin/env bash
# The long chaos soak of issue [1/4]: every hostile mode of `skein demo
# --chaos --hostile MODE` in turn, each its own run (a mode brings the run it
# needs: NoLoCo, staged), with volunteers killed -9, restarted and paused
# throughout. Prints each mode's closing summary and invariants, then a table,
# and exits 1 if any invariant broke.
#   bash scripts/soak.sh                  # every mode, 110 s each (staged ones: 60 iterations); about 35 minutes
#   SECONDS_PER_MODE=60 bash scripts/soak.sh lonejump sybils
set -uo pipefail
cd "$(dirname "$0")/.."
per="${SECONDS_PER_MODE:-110}"
out="${SOAK_DIR:-$(mktemp -d /tmp/skein-soak-XXXXXX)}"
bin="$out/skein"
go build -o "$bin" ./cmd/skein || exit 1
modes=("$@")
if [ ${#modes[@]} -eq 0 ]; then
  # The modes' names, from the binary's own list.
  mapfile -t modes < <("$bin" demo --help | grep -- '--hostile value' | sed 's/.*--chaos): //' | tr ';' '\n' | sed -n 's/^ *\([a-z-]*\) (.*/\1/p')
fi
[ ${#modes[@]} -gt 0 ] || { echo "no hostile modes found in skein demo --help" >&2; exit 1; }
corpus="$(go env GOROOT)/src"
echo "soak: ${#modes[@]} modes x ${per}s in $out: ${modes[*]}"
failed=0
table=""
for m in "${modes[@]}"; do
  dir="$out/$m"
  began=$(date +%s)
  case "$m" in
  staged-* | checkfree-*) # a staged run: its chaos is a stage killed -9 halfway and rebuilt
    # (it ends after 60 iterations and once the lost stage has trained again,
    # not at a duration: a loaded machine can take longer than $per s)
    "$bin" demo --hostile "$m" --steps 60 --http 127.0.0.1:0 --threads 1 --dir "$dir" \
      --corpus "$corpus/strings" >"$out/$m.out" 2>&1 ;;
  *)
    "$bin" demo --chaos --hostile "$m" --duration "${per}s" --inner-steps 5 --http 127.0.0.1:0 --rate 200 --latency 5ms \
      --threads 1 --dir "$dir" --corpus "$corpus/strings" --corpus "$corpus/bufio" --volunteers 3 \
      --chaos-every 30s --chaos-pause 8s >"$out/$m.out" 2>&1 ;;
  esac
  rc=$?
  took=$(( $(date +%s) - began ))
  echo "== $m (exit $rc, ${took}s)"
  sed -n '/^summary/,$p' "$out/$m.out"
  rounds=$(sed -n 's/.* over \([0-9]*\) \(rounds\|iterations\).*/\1/p' "$out/$m.out" | head -1)
  ok=$(grep -c '^  ok ' "$out/$m.out")
  bad=$(grep -c '^  FAIL ' "$out/$m.out")
  if [ "$rc" -ne 0 ] || [ "$bad" -gt 0 ]; then failed=1; fi
  table+=$(printf '%-16s %6s rounds  %2s ok  %2s failed  exit %s' "$m" "${rounds:-?}" "$ok" "$bad" "$rc")$'\n'
done
echo
echo "soak summary ($per s per mode; logs in $out):"
printf '%s' "$table"
exit $failed
