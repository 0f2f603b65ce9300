#!/usr/bin/env bash
# Snapshots written by every rank into one file, under faults: a rank killed while the file is being
# written leaves a directory that resumes (the previous snapshot whole, the half-written one never
# named by latest.h5 and cleared by the rerun); a full file system (a small tmpfs, where this machine
# lets us mount one) is one clean line and a non-zero exit (every rank stops alike), with the previous snapshot
# intact and readable. And the schema page: every key a snapshot holds is one docs/snapshots.md lists.
# usage: snapshot_faults.sh MPIDDP_BINARY DOCS_SNAPSHOTS_MD
source "$(dirname "$0")/lib.sh"
mpiddp=$1 schema_doc=$2
tmp=$(mktemp -d)
mounted=
trap '[ -n "$mounted" ] && umount "$mounted"; rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=240

text_shards "$tmp/tiny" 6000 3
# About 3 M parameters with AdamW: a 40 MB snapshot, long enough to write that a kill lands inside it.
gpt=(train --model gpt --n-layer 4 --n-head 4 --n-embd 256 --block-size 32 --vocab-size 256
     --data "$tmp/tiny_train_000001.bin" --batch-size 2 --threads 1 --optimizer adamw --lr 0.001)
latest_step() {
  local t
  t=$(readlink "$1/latest.h5" 2>/dev/null) || { echo 0; return; }
  t=${t#snapshot-step}
  echo $((10#${t%.h5}))
}

ended_soon() { [ "$rc" -ne 0 ] && [ $(( $(date +%s) - t0 )) -lt 30 ]; }

# ---- a rank killed while every rank writes its part -----------------------------------------------
for stage in 0 2; do
  d=$tmp/kill-s$stage
  start_bg 2 "$mpiddp" "${gpt[@]}" --zero-stage $stage --max-steps 40 --save-every-steps 1 --keep 2 --snapshot-dir "$d"
  # Until a snapshot after the first is under way: its temporary file exists, latest.h5 names an older one.
  caught=
  for _ in $(seq 1 200000); do
    if [ "$(latest_step "$d")" -ge 1 ] && compgen -G "$d/.snapshot-step*.h5.tmp" >/dev/null; then
      t0=$(date +%s)
      kill -9 "$(rank_pid "$d" 1)" && caught=$(compgen -G "$d/.snapshot-step*.h5.tmp" | head -n 1)
      break
    fi
    kill -0 "$bg" 2>/dev/null || break
  done
  wait_bg
  check "stage $stage: rank 1 killed while snapshot $(basename "$caught") was being written" [ -n "$caught" ]
  # (137: mpiexec passes the killed rank's signal on)
  check "stage $stage: ... ends the job non-zero within 30 s" ended_soon
  before=$(latest_step "$d")
  check "stage $stage: ... latest.h5 names a complete earlier snapshot (step $before)" \
    "$mpiddp" export "$d/latest.h5" --out "$tmp/probe-$stage.pt"
  # Two steps past it: a resumed run that writes snapshots again (40 MB a step) and completes.
  run_np 2 "$mpiddp" "${gpt[@]}" --zero-stage $stage --max-steps $((before + 2)) --save-every-steps 1 --keep 2 \
    --snapshot-dir "$d" --resume auto
  check "stage $stage: the rerun resumes from step $before" contains "^Resuming training from snapshot at .*(global step $before," "$out"
  check "stage $stage: ... and completes" [ "$rc" -eq 0 ]
  check "stage $stage: ... leaving no half-written file" [ -z "$(compgen -G "$d/.snapshot-step*.h5.tmp")" ]
done

# ---- the schema page lists every key the codec writes ---------------------------------------------
documented() {  # documented SNAPSHOT: its attributes, groups, optimizer fields and dataset attributes are in the page
  py - "$1" "$schema_doc" <<'PY'
import h5py, re, sys
doc = open(sys.argv[2]).read()
names = set(re.findall(r"`([A-Za-z_0-9]+)`", doc))
where = {"model": "`/model/<name>`", "optimizer": "`/optimizer/<param>/<field>`", "rng": "`/rng/rank<r>`",
         "torchscript": "`/torchscript`"}
f = h5py.File(sys.argv[1], "r")
missing = sorted(a for a in f.attrs if a not in names)
def visit(name, obj):
    if not isinstance(obj, h5py.Dataset):
        return
    top = name.split("/")[0]
    if where.get(top) is None or where[top] not in doc:
        missing.append("/" + name)
    if top == "optimizer" and name.split("/")[-1] not in names:
        missing.append("/" + name)
    missing.extend(f"/{name}@{a}" for a in obj.attrs if a not in names)
f.visititems(visit)
print("undocumented:", ", ".join(missing[:10]) or "none")
sys.exit(1 if missing else 0)
PY
}
check "schema: every key of a stage-0 GPT snapshot is in docs/snapshots.md" documented "$tmp/kill-s0/latest.h5"
check "schema: every key of a stage-2 GPT snapshot is in docs/snapshots.md" documented "$tmp/kill-s2/latest.h5"

# ---- damage that keeps the file's own header true ------------------------------------------------
# reseal SNAPSHOT: after an edit with h5py, rewrite the header as mpiddp would (the file's size, the
# raw extents, the CRC-32 of HDF5's structure), so that only the checks behind it can refuse it.
reseal() {
  py - "$1" <<'PY'
import h5py, json, os, sys, zlib
path = sys.argv[1]
with open(path, "rb") as f:
    first = f.read(512).split(b"\n")[0].decode()
size = int(first.split()[3])
raw = []
with h5py.File(path, "r") as f:
    f.visititems(lambda n, o: raw.append([o.id.get_offset(), o.id.get_storage_size()])
                 if isinstance(o, h5py.Dataset) and o.id.get_offset() is not None and o.id.get_storage_size() else None)
raw.sort()
data = open(path, "rb").read()
crc, at = 0, size
for off, n in raw:
    crc = zlib.crc32(data[at:off], crc)
    at = off + n
crc = zlib.crc32(data[at:], crc)
header = f"mpiddp-snapshot 3 header {size}\n" + json.dumps({"bytes": len(data), "structure_crc32": crc, "raw": raw},
                                                            separators=(",", ":"), sort_keys=True) + "\n"
with open(path, "r+b") as f:
    f.write(header.encode().ljust(size, b"\0"))
PY
}
damaged() {  # damaged NAME PYTHON-EDIT: a copy of the stage-0 snapshot edited by h5py, then resealed
  cp "$tmp/kill-s0/latest.h5" "$tmp/$1.h5"
  py -c "import h5py, numpy; f = h5py.File('$tmp/$1.h5', 'r+'); $2; f.close()"
  reseal "$tmp/$1.h5"
}
damaged wrong-crc 'f["model/transformer.ln_f.weight"].attrs["crc32"] = numpy.int64(12345)'
damaged wrong-bytes 'd = f["model/transformer.wte.weight"]; d[0, 0] = d[0, 0] + 1'
damaged missing 'del f["model/transformer.h.0.attn.c_attn.weight"]'
# A dataset's bytes changed: its CRC-32 refuses it. Its stored CRC changed, or a dataset gone: the
# root checksum over every dataset's name and CRC refuses it first.
for case in "wrong-bytes:is corrupt: the CRC-32 of dataset /model/transformer.wte.weight does not match" \
            "wrong-crc:is corrupt: its checksum does not match its contents" \
            "missing:is corrupt: its checksum does not match its contents"; do
  name=${case%%:*} want=${case#*:}
  run_np 2 "$mpiddp" "${gpt[@]}" --max-steps 40 --resume "$tmp/$name.h5"
  check "$name (header resealed): refused, no hang" failed_cleanly
  check "$name: one line" one_line "$err"
  check "$name: says '$want'" contains "$want" "$err"
done

# ---- a full file system -----------------------------------------------------------------------------
small=(train --model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 16 --vocab-size 256
       --data "$tmp/tiny_train_000001.bin" --batch-size 2 --threads 1 --optimizer adamw --lr 0.001 --save-every-steps 2)
run_np 2 "$mpiddp" "${small[@]}" --max-steps 2 --snapshot-dir "$tmp/sizing"
bytes=$(stat -L -c %s "$tmp/sizing/latest.h5")
mkdir -p "$tmp/full"
if mount -t tmpfs -o size=$(( bytes * 3 / 2 / 4096 * 4096 + 4096 )) mpiddp-test "$tmp/full" 2>/dev/null; then
  mounted=$tmp/full
  # Room for one snapshot and a half: the second cannot be written while the first is kept.
  run_np 2 "$mpiddp" "${small[@]}" --max-steps 6 --keep 1 --snapshot-dir "$tmp/full"
  check "full disk: non-zero exit, no hang" failed_cleanly
  check "full disk: one line" one_line "$err"
  check "full disk: ... saying there is no room and that the previous snapshot is intact" \
    contains "no room on the file system of '$tmp/full'.*(the previous snapshot is intact)" "$err"
  check "full disk: latest.h5 is the step-2 snapshot" [ "$(latest_step "$tmp/full")" -eq 2 ]
  check "full disk: ... whole and readable" "$mpiddp" export "$tmp/full/latest.h5" --out "$tmp/full-probe.pt"
  check "full disk: ... nothing half-written left" [ -z "$(compgen -G "$tmp/full/.snapshot-step*.h5.tmp")" ]
else
  echo "SKIP - full disk: this machine does not let the test mount a tmpfs (needs root)"
fi
finish
