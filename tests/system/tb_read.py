"""Reads TensorBoard event files independently of mpiddp's writer and compares them with the
JSON-lines metrics of the same run.

The framing is checked with a CRC-32C written here from its definition (bitwise, Castagnoli
polynomial, reflected), not with Boost.CRC the writer uses; the events are decoded by Debian's
python3-protobuf from the module protoc generates from src/log/tensorboard.proto.
usage: tb_read.py PROTO_MODULE_DIR EVENT_DIR METRICS.jsonl [--expect-start STEP] [--expect-text SUBSTRING]...
"""
import glob, json, math, os, struct, sys

sys.path.insert(0, sys.argv[1])
import tensorboard_pb2 as tb  # noqa: E402


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the published check value of CRC-32C


def records(path):
    raw = open(path, "rb").read()
    at = 0
    while at < len(raw):
        assert at + 12 <= len(raw), f"{path}: truncated header at byte {at}"
        (length,) = struct.unpack_from("<Q", raw, at)
        (length_crc,) = struct.unpack_from("<I", raw, at + 8)
        assert length_crc == masked(raw[at:at + 8]), f"{path}: bad length CRC at byte {at}"
        data = raw[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack_from("<I", raw, at + 12 + length)
        assert data_crc == masked(data), f"{path}: bad data CRC at byte {at}"
        at += 12 + length + 4
        yield data


def main():
    event_dir, metrics = sys.argv[2], sys.argv[3]
    expect_start, expect_text = None, []
    args = sys.argv[4:]
    while args:
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--expect-start":
            expect_start = int(value)
        elif flag == "--expect-text":
            expect_text.append(value)
    files = sorted(glob.glob(os.path.join(event_dir, "events.out.tfevents.*")))
    assert files, f"no event files in {event_dir}"
    scalars = {}  # (tag, step) -> [values]
    texts, starts = [], []
    for path in files:
        events = [tb.Event.FromString(r) for r in records(path)]
        assert events and events[0].file_version == "brain.Event:2", f"{path}: first event is not the file version"
        for e in events[1:]:
            assert e.wall_time > 1.6e9, e
            kind = e.WhichOneof("what")
            if kind == "session_log":
                assert e.session_log.status == tb.SessionLog.START
                starts.append(e.step)
                continue
            assert kind == "summary", e
            for v in e.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    scalars.setdefault((v.tag, e.step), []).append(v.simple_value)
                else:
                    assert v.metadata.plugin_data.plugin_name == "text" and v.tensor.dtype == tb.DT_STRING, v
                    texts.append(v.tensor.string_val[0].decode())
    rows = [json.loads(line) for line in open(metrics)]
    expected = {}
    for r in rows:
        prefix = {"log": "train/", "epoch": "epoch/"}[r["kind"]]
        keys = ["train_loss", "samples_per_s", "tokens_per_s", "flops_per_s", "mfu", "lr"] if r["kind"] == "log" else \
            ["train_loss", "test_loss", "test_accuracy", "samples_per_s", "tokens_per_s", "flops_per_s", "mfu",
             "seconds", "lr"]
        for k in keys:
            if k in r:
                tag = prefix + ("loss" if (r["kind"] == "log" and k == "train_loss") else k)
                expected.setdefault((tag, r["global_step"]), []).append(r[k])
    # Every scalar in the files is a JSON number (as float32) and every JSON number is there.
    assert sorted(scalars) == sorted(expected), (sorted(set(scalars) ^ set(expected)))
    for key, values in expected.items():
        got = scalars[key]
        want = [struct.unpack("<f", struct.pack("<f", x))[0] for x in values]
        assert got == want, (key, got, want)
        assert all(math.isfinite(x) for x in got), (key, got)
    for s in expect_text:
        assert any(s in t for t in texts), (s, texts)
    if expect_start is not None:
        assert starts == [expect_start], starts
    else:
        assert not starts, starts
    logs = sum(r["kind"] == "log" for r in rows)
    epochs = sum(r["kind"] == "epoch" for r in rows)
    print(f"{len(files)} file(s), {sum(len(v) for v in scalars.values())} scalars = JSON lines ({logs} log, "
          f"{epochs} epoch), {len(texts)} text(s), CRCs ok")


main()
