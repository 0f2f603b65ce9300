#!/usr/bin/env bash
# The built-in GPT to and from Hugging Face (transformers' GPT-2, safetensors), against the test
# Python's transformers and safetensors: `mpiddp export --format hf` loads with
# safetensors.torch.load_file and GPT2LMHeadModel.from_pretrained, whose loss on the validation
# windows equals mpiddp's test loss (1e-4) and whose greedy continuation equals `mpiddp generate
# --top-k 1`; our writer's bytes are the safetensors library's; `train --init-from DIR` reads
# save_pretrained()'s directory (gelu_new) and GPT2Model-style names with mask buffers and lm_head;
# export -> init-from -> export is bitwise; bad directories are one line at 2 ranks, never a hang.
# usage: hf_export.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=180

# The Python side, one program: hf COMMAND ARGS...
hf_py=$(cat <<'PY'
import json, os, shutil, sys
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
import transformers
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

def read_shard(path):  # llm.c's shard: 256 int32 of header, then uint16 tokens
    data = open(path, "rb").read()
    count = int(torch.frombuffer(bytearray(data[:1024]), dtype=torch.int32)[2])
    return torch.frombuffer(bytearray(data[1024:1024 + 2 * count]), dtype=torch.int16).long() & 0xFFFF

def model(d):
    return transformers.GPT2LMHeadModel.from_pretrained(d).eval()

def loss(d, shard, t):  # mpiddp's test loss: the mean over every position of windows i*T .. i*T+T
    m, tokens, t = model(d), read_shard(shard), int(t)
    n = (tokens.numel() - 1) // t
    rows = torch.stack([tokens[i * t:i * t + t + 1] for i in range(n)])
    with torch.no_grad():
        logits = m(input_ids=rows[:, :-1]).logits
    print(f"{torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1)).item():.8f}")

def generate(d, prompt, n):  # nanoGPT's greedy rule: the context cropped to n_positions
    m = model(d)
    idx = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        for _ in range(int(n)):
            logits = m(input_ids=idx[:, -m.config.n_positions:]).logits[:, -1]
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], 1)
    sys.stdout.buffer.write(bytes(idx[0].tolist()))

def names(d, n_layer):  # GPT2LMHeadModel's names without the tied lm_head, all float32
    sd = load_file(os.path.join(d, "model.safetensors"))
    want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    for i in range(int(n_layer)):
        for p in ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]:
            want |= {f"transformer.h.{i}.{p}.weight", f"transformer.h.{i}.{p}.bias"}
    assert set(sd) == want, set(sd) ^ want
    assert all(t.dtype == torch.float32 for t in sd.values())
    c = json.load(open(os.path.join(d, "config.json")))
    assert c["model_type"] == "gpt2" and c["architectures"] == ["GPT2LMHeadModel"] and c["tie_word_embeddings"], c
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()

def conv1d(d, state):  # c_attn is stored [in, out]: the transpose of nn.Linear's [out, in]
    sd, ours = load_file(os.path.join(d, "model.safetensors")), torch.load(state)
    for k in ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]:
        assert torch.equal(sd[f"transformer.h.0.{k}.weight"], ours[f"transformer.h.0.{k}.weight"].t()), k
    assert torch.equal(sd["transformer.wte.weight"], ours["lm_head.weight"])

def zero_biases(d):
    sd = load_file(os.path.join(d, "model.safetensors"))
    biases = [k for k in sd if k.endswith(".bias")]
    assert biases and all(not sd[k].any() for k in biases), biases

def resave(src, dst):  # the safetensors library writes the same tensors and metadata
    with safe_open(src, "pt") as f:
        metadata = f.metadata()
    save_file(load_file(src), dst, metadata=metadata)

def random_gpt2(d, activation, seed):  # a tiny GPT-2 from transformers itself, save_pretrained()
    torch.manual_seed(int(seed))
    c = transformers.GPT2Config(vocab_size=256, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                activation_function=activation)
    m = transformers.GPT2LMHeadModel(c)
    with torch.no_grad():  # biases and LayerNorms away from their 0/1 start, so a mix-up shows; the
        for name, p in m.named_parameters():  # MLP's inputs where the two GELUs differ, and sharp logits
            if "ln_" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
            elif "mlp.c_fc" in name or "wte" in name:
                p.normal_(0, 0.35 if "mlp" in name else 1.0)
            elif "mlp.c_proj" in name:
                p.normal_(0, 1.0)
    m.save_pretrained(d)

def bare_names(src, dst):  # GPT2Model's names, the old mask buffers and lm_head written out
    shutil.copytree(src, dst)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out = {k[len("transformer."):]: v for k, v in sd.items()}
    for i in range(json.load(open(os.path.join(src, "config.json")))["n_layer"]):
        out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
        out[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    out["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})

def same(a, b):  # the same GPT-2 tensors, bitwise (a's lm_head and mask buffers aside)
    sa = {k if k.startswith("transformer.") or k == "lm_head.weight" else "transformer." + k: v
          for k, v in load_file(os.path.join(a, "model.safetensors")).items()}
    sa = {k: v for k, v in sa.items() if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))}
    sb = load_file(os.path.join(b, "model.safetensors"))
    assert set(sa) == set(sb), set(sa) ^ set(sb)
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not bad, bad

def activation(d):
    print(json.load(open(os.path.join(d, "config.json")))["activation_function"])

def edit_config(d, key, value):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    c[key] = json.loads(value)
    json.dump(c, open(p, "w"))

def drop_tensor(d, name):
    p = os.path.join(d, "model.safetensors")
    sd = load_file(p)
    del sd[name]
    save_file(sd, p, metadata={"format": "pt"})

globals()[sys.argv[1]](*sys.argv[2:])
PY
)
hf() { py -c "$hf_py" "$@"; }
val_loss() { py -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"epoch\"' in l][-1]['test_loss'])" "$1"; }
close() { py -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-4)" "$1" "$2"; }

text_shards "$tmp/tiny" 1500 7
train=$tmp/tiny_train_000001.bin val=$tmp/tiny_val_000000.bin
gpt=(--model gpt --n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 256)
fit=(--data "$train" --test-data "$val" --batch-size 4 --threads 1 --optimizer adamw --lr 3e-3)
# A step that leaves every weight as it is (1e-300 is 0 in float32): a snapshot, and mpiddp's test
# loss, of the weights --init-from loaded.
still=(--data "$train" --test-data "$val" --batch-size 2 --max-steps 1 --threads 1 --optimizer sgd --lr 1e-300)

# A tiny GPT trained a few steps at 2 ranks, exported.
run_np 2 "$mpiddp" train "${gpt[@]}" "${fit[@]}" --max-steps 6 --snapshot-dir "$tmp/run" --metrics "$tmp/run.json"
check "a tiny GPT trains at 2 ranks" [ "$rc" -eq 0 ]
run_np 2 "$mpiddp" export "$tmp/run/latest.h5" --format hf --out "$tmp/hf"
check "export --format hf: config.json and model.safetensors written" \
  [ "$rc" -eq 0 -a -f "$tmp/hf/config.json" -a -f "$tmp/hf/model.safetensors" ]
check "safetensors.torch.load_file reads it: GPT-2's names, no lm_head, float32; config gpt2, tied" hf names "$tmp/hf" 2
run_alone "$mpiddp" export "$tmp/run/latest.h5" --format state-dict --out "$tmp/run.pt"
check "the attention and MLP weights are Conv1D's [in, out]: nn.Linear's transposed" hf conv1d "$tmp/hf" "$tmp/run.pt"
check "activation_function: gelu, the exact GELU of the built-in GPT" [ "$(hf activation "$tmp/hf")" = gelu ]
hf resave "$tmp/hf/model.safetensors" "$tmp/python.safetensors"
check "the safetensors library writes the same tensors and metadata byte for byte as mpiddp" \
  cmp "$tmp/hf/model.safetensors" "$tmp/python.safetensors"

want=$(val_loss "$tmp/run.json")
got=$(hf loss "$tmp/hf" "$val" 16)
check "GPT2LMHeadModel.from_pretrained's loss on the validation windows $got = mpiddp's test loss $want (1e-4)" \
  close "$got" "$want"
want=$(hf generate "$tmp/hf" "the quick" 40)
run_alone "$mpiddp" generate "$tmp/run/latest.h5" --prompt "the quick" --max-new-tokens 40 --top-k 1
check "transformers' greedy continuation equals mpiddp generate --top-k 1" [ "$rc" -eq 0 -a "$out" = "$want" ]

# Without biases: GPT-2 has them, so zeros are written, and the model computes the same.
run_np 1 "$mpiddp" train "${gpt[@]}" --bias false "${fit[@]}" --max-steps 3 --snapshot-dir "$tmp/nobias" \
  --metrics "$tmp/nobias.json"
run_alone "$mpiddp" export "$tmp/nobias/latest.h5" --format hf --out "$tmp/hf-nobias"
check "--bias false: every bias written as zeros" hf zero_biases "$tmp/hf-nobias"
check "--bias false: transformers' loss = mpiddp's test loss (1e-4)" \
  close "$(hf loss "$tmp/hf-nobias" "$val" 16)" "$(val_loss "$tmp/nobias.json")"

# export -> init-from -> export: bitwise.
run_np 2 "$mpiddp" train --model gpt --init-from "$tmp/hf" "${still[@]}" --snapshot-dir "$tmp/again"
check "train --init-from DIR (the export) at 2 ranks" [ "$rc" -eq 0 ]
run_alone "$mpiddp" export "$tmp/again/latest.h5" --format hf --out "$tmp/hf-again"
check "export -> init-from -> export: model.safetensors bitwise" cmp "$tmp/hf/model.safetensors" "$tmp/hf-again/model.safetensors"
check "export -> init-from -> export: config.json the same" cmp "$tmp/hf/config.json" "$tmp/hf-again/config.json"

# A directory transformers wrote itself (save_pretrained of a random tiny GPT-2 with gelu_new):
# loaded by config.json's shape, trained on, exported with the same tensors and activation, and
# mpiddp's loss of those weights is transformers' (torch's tanh GELU is transformers' NewGELU).
hf random_gpt2 "$tmp/py" gelu_new 5
run_np 2 "$mpiddp" train --model gpt --init-from "$tmp/py" "${still[@]}" --snapshot-dir "$tmp/py-run" \
  --metrics "$tmp/py-run.json"
check "init-from save_pretrained()'s directory (no shape flags): trains" [ "$rc" -eq 0 ]
run_alone "$mpiddp" export "$tmp/py-run/latest.h5" --format hf --out "$tmp/py-again"
check "its export holds transformers' tensors bitwise" hf same "$tmp/py" "$tmp/py-again"
check "its export keeps activation_function gelu_new" [ "$(hf activation "$tmp/py-again")" = gelu_new ]
got=$(val_loss "$tmp/py-run.json")
cp -r "$tmp/py" "$tmp/py-exact" && hf edit_config "$tmp/py-exact" activation_function '"gelu"'
new=$(hf loss "$tmp/py" "$val" 16) exact=$(hf loss "$tmp/py-exact" "$val" 16)
check "gelu_new: mpiddp's test loss $got = transformers' $new (1e-4)" close "$got" "$new"
# The two GELUs differ by at most 5e-4, so the loss tells them apart by little (2.8e-5 when written):
# mpiddp's must be nearer NewGELU's loss than a quarter of the distance to the exact GELU's.
check "gelu_new: nearer transformers' NewGELU loss than a quarter of the way to its exact GELU's $exact" \
  py -c "import sys; g, n, e = map(float, sys.argv[1:]); sys.exit(not 4 * abs(g - n) < abs(g - e))" "$got" "$new" "$exact"
hf bare_names "$tmp/py" "$tmp/py-bare"
run_np 1 "$mpiddp" train --model gpt --init-from "$tmp/py-bare" "${still[@]}" --snapshot-dir "$tmp/bare-run"
run_alone "$mpiddp" export "$tmp/bare-run/latest.h5" --format hf --out "$tmp/bare-again"
check "GPT2Model's names, attn.bias/masked_bias buffers and lm_head.weight present: the same tensors" \
  hf same "$tmp/py-bare" "$tmp/bare-again"

# Bad input at 2 ranks: one line from rank 0, every rank exits non-zero, nothing hangs.
error_is() { failed_cleanly && one_line "$err" && contains "$1" "$err"; }  # MESSAGE: one line, non-zero, no hang
refused() {  # DESCRIPTION MESSAGE TRAIN_ARGS...
  local desc=$1 message=$2
  shift 2
  run_np 2 "$mpiddp" train "$@" "${still[@]}"
  check "np2 $desc: one line, non-zero exit, no hang" error_is "$message"
}
cp -r "$tmp/py" "$tmp/llama" && hf edit_config "$tmp/llama" model_type '"llama"'
refused "another architecture" "model_type 'llama' is not gpt2" --model gpt --init-from "$tmp/llama"
mkdir "$tmp/no-weights" && cp "$tmp/py/config.json" "$tmp/no-weights/"
refused "no model.safetensors" "has no model.safetensors" --model gpt --init-from "$tmp/no-weights"
mkdir "$tmp/no-config" && cp "$tmp/py/model.safetensors" "$tmp/no-config/"
refused "no config.json" "has no config.json" --model gpt --init-from "$tmp/no-config"
cp -r "$tmp/py" "$tmp/wide" && hf edit_config "$tmp/wide" n_embd 64
refused "shapes that disagree with config.json" "transformer.wte.weight is \[256, 32\] but config.json makes it \[256, 64\]" \
  --model gpt --init-from "$tmp/wide"
cp -r "$tmp/py" "$tmp/missing" && hf drop_tensor "$tmp/missing" transformer.h.1.mlp.c_fc.bias
refused "a tensor missing" "lacks tensor transformer.h.1.mlp.c_fc.bias" --model gpt --init-from "$tmp/missing"
cp -r "$tmp/py" "$tmp/cut" && truncate -s -4 "$tmp/cut/model.safetensors"
refused "a truncated model.safetensors" "tensors' offsets cover" --model gpt --init-from "$tmp/cut"
refused "a shape flag against config.json" "--n-layer 3 disagrees with" --model gpt --init-from "$tmp/py" --n-layer 3
refused "another model" "it starts --model gpt, not mlp" --model mlp --init-from "$tmp/py"

run_np 1 "$mpiddp" data synthetic --samples 64 --out "$tmp/syn.h5"
run_np 1 "$mpiddp" train --model linear --data "$tmp/syn.h5" --max-steps 1 --snapshot-dir "$tmp/linear"
run_np 2 "$mpiddp" export "$tmp/linear/latest.h5" --format hf --out "$tmp/hf-linear"
check "np2 export --format hf of a non-GPT snapshot: one line, non-zero exit" error_is "is not of the built-in GPT"

finish
