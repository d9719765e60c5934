#!/usr/bin/env bash
# A crash mid-save never destroys the previous checkpoint: checkpoint_writer saves a 32 MB file
# over and over (nn::save_tensors, i.e. write_safetensors's temporary file + fsync + rename), and is
# killed with SIGKILL at a random moment, 12 times. After each kill the file at the final path must
# load and hold one complete version, no older than the last save the writer reported finished.
# A kill during a save leaves its temporary file (PATH.tmp.HOST.PID.N) behind: loaders never read it,
# and the next round's first save deletes it, so at most one is ever there. Some kills must land
# mid-save (leaving that file), or the test could not fail.
set -u
writer="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
path="$dir/model.safetensors"
megabytes=32
failures=0
rounds=12
mid_save=0

for round in $(seq 1 "$rounds"); do
  rm -f "$dir/log"  # else the wait below could see the last round's log before the new writer truncates it
  "$writer" write "$path" "$megabytes" >"$dir/log" 2>&1 &
  pid=$!
  # Wait for a first save of this round, so each kill lands on a later save over an existing file.
  for _ in $(seq 1 600); do
    grep -qs '^saved' "$dir/log" && break
    sleep 0.05
  done
  sleep "0.$((RANDOM % 400))"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  reported=$(grep '^saved' "$dir/log" | tail -n 1 | cut -d' ' -f2)
  if [ -z "$reported" ]; then
    echo "FAIL: round $round: the writer never finished a save"; cat "$dir/log"; failures=$((failures + 1))
    continue
  fi
  found=$("$writer" check "$path" "$megabytes" 2>&1)
  status=$?
  # The file may be one version ahead of the log: killed after the rename, before the print.
  if [ "$status" -ne 0 ] || [ "$found" -lt "$reported" ] || [ "$found" -gt $((reported + 1)) ]; then
    echo "FAIL: round $round: after 'saved $reported' the checkpoint reads: $found"; failures=$((failures + 1))
  else
    echo "ok: round $round: killed after 'saved $reported', checkpoint holds version $found"
  fi
  leftovers=$(find "$dir" -name 'model.safetensors.tmp.*' | wc -l)
  if [ "$leftovers" -gt 1 ]; then
    echo "FAIL: round $round: $leftovers temporary files, the earlier ones were not deleted"; ls "$dir"
    failures=$((failures + 1))
  fi
  mid_save=$((mid_save + leftovers))
done

echo "$mid_save of $rounds kills landed mid-save"
if [ "$mid_save" -eq 0 ]; then
  echo "FAIL: no kill landed during a save, so nothing was tested"; failures=$((failures + 1))
fi
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
