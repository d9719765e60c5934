#!/usr/bin/env bash
# A crash mid-save never destroys the previous file: checkpoint_writer saves a 32 MB checkpoint over and
# over (nn::save_tensors, i.e. core/atomic_file.h's temporary file + fsync + rename), and is killed with
# SIGKILL at a random moment, 12 times; then the same for a 32 MB text file (write_file_atomic, as
# vocabularies, translations and charts are written), 8 times or more. After each kill the file at the final
# path must load and hold one complete version, no older than the last save the writer reported finished.
# A kill during a save leaves its temporary file (PATH.tmp.HOST.PID.N) behind: loaders never read it,
# and the next round's first save deletes it, so at most one is ever there. Some kills must land
# mid-save (leaving that file), or the test could not fail.
set -u
writer="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# kill_rounds FILE WRITE_MODE CHECK_MODE MEGABYTES ROUNDS: ROUNDS kills, and up to twice as many more
# while none has landed mid-save.
kill_rounds() {
  local path="$dir/$1" write=$2 check=$3 megabytes=$4 rounds=$5 mid_save=0 round=0
  while ((round < rounds || (mid_save == 0 && round < 3 * rounds))); do
    round=$((round + 1))
    rm -f "$dir/log"  # else the wait below could see the last round's log before the new writer truncates it
    "$writer" "$write" "$path" "$megabytes" >"$dir/log" 2>&1 &
    local pid=$!
    # Wait for a first save of this round, so each kill lands on a later save over an existing file.
    for _ in $(seq 1 600); do
      grep -qs '^saved' "$dir/log" && break
      sleep 0.05
    done
    sleep "0.$((RANDOM % 400))"
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    local reported found status leftovers
    reported=$(grep '^saved' "$dir/log" | tail -n 1 | cut -d' ' -f2)
    if [ -z "$reported" ]; then
      echo "FAIL: $1 round $round: the writer never finished a save"; cat "$dir/log"; failures=$((failures + 1))
      continue
    fi
    found=$("$writer" "$check" "$path" "$megabytes" 2>&1)
    status=$?
    # The file may be one version ahead of the log: killed after the rename, before the print.
    if [ "$status" -ne 0 ] || [ "$found" -lt "$reported" ] || [ "$found" -gt $((reported + 1)) ]; then
      echo "FAIL: $1 round $round: after 'saved $reported' the file reads: $found"; failures=$((failures + 1))
    else
      echo "ok: $1 round $round: killed after 'saved $reported', the file holds version $found"
    fi
    leftovers=$(find "$dir" -name "$1.tmp.*" | wc -l)
    if [ "$leftovers" -gt 1 ]; then
      echo "FAIL: $1 round $round: $leftovers temporary files, the earlier ones were not deleted"; ls "$dir"
      failures=$((failures + 1))
    fi
    mid_save=$((mid_save + leftovers))
  done
  echo "$1: $mid_save of $round kills landed mid-save"
  if [ "$mid_save" -eq 0 ]; then
    echo "FAIL: $1: no kill landed during a save, so nothing was tested"; failures=$((failures + 1))
  fi
}

kill_rounds model.safetensors write check 32 12
kill_rounds translations.txt write-text check-text 32 8
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
