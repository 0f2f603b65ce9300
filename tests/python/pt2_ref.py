"""Python side of tests/system/pt2_cli.sh: torch.export programs (.pt2 archives) and data, the
reference training in Python, and checks of what mpiddp trained and exported. Needs torch >= 2.6
(torch.export.save/load and the PT2 archive); the pip venv's 2.11 and sid's 2.14.

  make-data OUT.h5 N SEED [SIZE]     classification set in mpiddp's layout (torchscript_ref.py's):
                                     [N, 1, SIZE, SIZE] float32, 4 classes at SIZE 8. Token data for
                                     the gpt kind: llm.c shards from lib.sh's text_shards.
  make-model KIND OUT.pt2 SEED       torch.export.export(model.train(), example) saved as OUT.pt2;
                                     KIND: mlp | bn | dropout | attn | dynamic | gpt | resnet18 (below).
                                     A model whose eval-mode program differs from its train-mode one
                                     (BatchNorm, dropout) gets both: "model" (train) and "eval" in
                                     one archive. Batch static (the example's, 4): mlp, attn,
                                     resnet18; dynamic (torch.export.Dim, 1-4096): bn, dropout, gpt,
                                     dynamic (example batch 3). resnet18 without torchvision: exit 77.
  make-models DIR SEED KIND...       make-model for each KIND into DIR/KIND.pt2 (seed SEED + i):
                                     one Python pays torch.export's imports once; a KIND it cannot
                                     build (resnet18) is left out, no file
  reference MODEL.pt2 DATA RANKS BATCH STEPS LR MOMENTUM OUT.pt [CLIP [SEED]]
      SGD (momentum) for STEPS steps on the global batch RANKS x BATCH, training the program's
      eager module (torch.export.load(MODEL).module(): Python running the same ATen graph), in
      the order mpiddp's sampler gives without shuffling (rank r takes samples r, r + RANKS, ...,
      the last ones padded by wrapping). It is what DDP computes: each rank's slice is its own
      forward (BatchNorm: its own batch statistics), the gradients are averaged (each slice's loss
      / RANKS), and the buffers are rank 0's. CLIP > 0: clip_grad_norm_ on the averaged gradients.
      torch.manual_seed(SEED) (default 0, mpiddp's --seed) right before the first step: mpiddp
      seeds the CPU generator with --seed and draws nothing from it before its first training
      forward, so dropout at one rank draws the same masks. DATA: an HDF5 set (cross-entropy of
      the outputs against the labels) or an llm.c shard (windows of the program's T + 1 tokens;
      a program of two inputs is forward(idx, targets) -> (logits, loss): --loss model).
      RANKS may be a list, "1,2,4": then OUT holds "{ranks}", one reference per count.
      OUT is a plain dict {state_dict name: tensor} (torch.save).
  compare REF.pt STATE_DICT.pt [TOL]  the same names, max abs difference <= TOL (1e-5)
  check-export REF.pt EXPORTED.pt2 [TOL]
      every program in the archive mpiddp exported (torch.export.load's "model" and any other,
      "eval") loads, its module's state_dict (parameters and buffers) equals REF within TOL (1e-5),
      and it runs on the archive's sample inputs with finite outputs
  eval-loss REF.pt MODEL.pt2 DATA.h5  mean cross-entropy on DATA of the archive's "eval" program
                                     (else "model") holding REF's tensors, in chunks of its batch
  make-bad DIR GOOD.pt2              archives mpiddp must refuse: truncated.pt2 (the first half of
                                     the bytes), major.pt2 (schema_version.major + 1), unknown_op.pt2
                                     (a node's target torch.ops.aten.no_such_op.default),
                                     missing_blob.pt2 (data/weights/weight_0 left out), other.pt2 (a
                                     zip of one text file); and control.pt2, GOOD rewritten the same
                                     way (zipfile, ZIP_STORED) but unchanged, which must train
  ops MODEL.pt2...                   the call_function targets of every program, as serialized
"""
import json
import os
import re
import sys
import warnings
import zipfile

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nanogpt_ref  # noqa: E402  (nanoGPT's GPT, its shard reader and windows)
import torchscript_ref  # noqa: E402  (the data layout, the BatchNorm model, compare)

# torch.export.load reads weights through torch.frombuffer of a read-only buffer and warns once.
warnings.filterwarnings("ignore", message="The given buffer is not writable")
SKIP = 77  # make-model of a kind this Python cannot build (resnet18 without torchvision)
IMAGE_BATCH = 4  # the image kinds' example batch: pt2_cli.sh trains the static ones at --batch-size 4


def version_ok():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return m and (int(m[1]), int(m[2])) >= (2, 6) and hasattr(torch, "export")


# ---- models ------------------------------------------------------------------------------------

class Mlp(nn.Module):  # Linear, LayerNorm, ReLU, Linear on the flattened 8 x 8 image
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.ln(self.fc1(x.flatten(1)))))


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x.flatten(1)))))


class Attention(nn.Module):
    """The image's 8 rows as a sequence of 8 tokens of 8 features: a projection plus a learned
    position embedding (nn.Embedding), one nn.MultiheadAttention layer (2 heads) with a residual,
    the mean over the sequence, a linear head."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.pos = nn.Embedding(8, 16)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        rows = x[:, 0]
        h = self.proj(rows) + self.pos(torch.arange(rows.shape[1], device=x.device))
        a, _ = self.mha(h, h, h, need_weights=False)
        return self.fc(self.ln(h + a).mean(1))


class Dynamic(nn.Module):
    """Exported with a dynamic batch: the view takes the batch as a symbolic size (aten.sym_size)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = x.reshape(x.size(0), -1)
        return self.fc2(F.gelu(self.ln(self.fc1(h))))


class HigherOrder(nn.Module):
    """The higher-order ops and the archive's corners: torch.cond on the data, a no_grad block
    (wrap_with_set_grad_enabled), a bfloat16 autocast region cast back by .float() (wrap_with_autocast
    and the _assert_tensor_metadata before the cast), a non-persistent buffer (an archive constant,
    not in the state_dict), two parameters that view one storage (one blob, two offsets)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 16)
        self.fc2 = nn.Linear(16, 4)
        base = torch.randn(2, 16)
        self.scale = nn.Parameter(base[0])  # one storage, offsets 0 and 16
        self.shift = nn.Parameter(base[1])
        self.register_buffer("mask", (torch.arange(16) % 3 != 0).float(), persistent=False)

    def forward(self, x):
        h = self.fc1(x.reshape(x.size(0), -1))
        with torch.no_grad():
            centre = h.mean(0, keepdim=True)
        h = h - centre
        with torch.autocast("cpu", dtype=torch.bfloat16):
            g = self.fc2(h * self.mask)
        g = g.float()
        return torch.cond(g.sum() > 0, lambda t, a, b: t * a + b, lambda t, a, b: t - a * b,
                          (g, self.scale[:4] * 1.0, self.shift[:4] * 1.0))


GPT_SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=256)  # pt2_cli.sh: --block-size 16


def build(kind):
    """(module, example inputs, dynamic_shapes) of KIND. mlp, attn and resnet18 keep every shape
    the example's, the batch (4) included; the others declare the batch dynamic (mpiddp evaluates
    a test set in batches of up to 1000 samples, so only they take --test-data)."""
    image = torch.randn(IMAGE_BATCH, 1, 8, 8)
    batch = torch.export.Dim("batch", min=1, max=4096)
    if kind == "mlp":
        return Mlp(), (image,), None
    if kind == "bn":
        return torchscript_ref.WithBatchNorm(), (image,), ({0: batch},)
    if kind == "dropout":
        return WithDropout(), (image,), ({0: batch},)
    if kind == "attn":
        return Attention(), (image,), None
    if kind == "hop":
        return HigherOrder(), (torch.randn(3, 1, 8, 8),), ({0: batch},)
    if kind == "dynamic":  # an example batch of 3: mpiddp's batches of 4 (and the tail) only fit a dynamic one
        return Dynamic(), (torch.randn(3, 1, 8, 8),), ({0: batch},)
    if kind == "gpt":  # nanoGPT's GPT, forward(idx, targets) -> (logits, loss), the batch dynamic
        s = GPT_SHAPE
        model = nanogpt_ref.ScriptedGPT(nanogpt_ref.Config(s["n_layer"], s["n_head"], s["n_embd"], s["block_size"],
                                                           s["vocab_size"], bias=True, dropout=0.0))
        idx = torch.randint(0, s["vocab_size"], (2, s["block_size"]))
        return model, (idx, torch.roll(idx, -1, 1)), ({0: batch}, {0: batch})
    if kind == "resnet18":
        try:
            import torchvision
        except ImportError:
            print("make-model resnet18: this Python has no torchvision", file=sys.stderr)
            sys.exit(SKIP)
        m = torchvision.models.resnet18(num_classes=4)
        m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)  # one channel
        return m, (image,), None
    raise SystemExit("unknown kind " + kind)


def save_programs(programs, out):
    """One program, or several ("model" and "eval") in one PT2 archive where this torch can."""
    if len(programs) > 1:
        try:
            from torch.export.pt2_archive._package import package_pt2
        except ImportError:
            package_pt2 = None
        if package_pt2 is not None:
            package_pt2(out, exported_programs=programs)
            return
    torch.export.save(programs["model"], out)


def make_model(kind, out, seed):
    if not version_ok():
        raise SystemExit(f"torch {torch.__version__} has no torch.export archive (2.6 or newer)")
    torch.manual_seed(int(seed))
    model, example, dynamic = build(kind)
    model.train()
    programs = {"model": torch.export.export(model, example, dynamic_shapes=dynamic)}
    model.eval()
    evaluation = torch.export.export(model, example, dynamic_shapes=dynamic)
    model.train()
    if str(evaluation.graph) != str(programs["model"].graph):  # mode-dependent layers: BatchNorm, dropout
        programs["eval"] = evaluation
    save_programs(programs, out)
    names = ", ".join(sorted(programs))
    print(f"{kind}: {out} ({names}; {'dynamic batch' if dynamic else 'static batch ' + str(example[0].shape[0])})")


def make_models(directory, seed, *kinds):
    for i, kind in enumerate(kinds):
        try:
            make_model(kind, os.path.join(directory, kind + ".pt2"), int(seed) + i)
        except SystemExit as e:
            if e.code != SKIP:  # a kind this Python cannot build is left out (no file), the rest made
                raise


# ---- programs ----------------------------------------------------------------------------------

def load_programs(path):
    """{name: ExportedProgram} of every program in the archive ("model" first)."""
    try:
        from torch.export.pt2_archive._package import load_pt2
        programs = dict(load_pt2(path).exported_programs)
    except ImportError:
        programs = {}
    if "model" not in programs:
        programs["model"] = torch.export.load(path)
    return dict(sorted(programs.items(), key=lambda kv: kv[0] != "model"))


def tie_shared(m):
    """Parameters the archive stores once (a tied weight: two names, one storage) become one
    Parameter, as in the module that was exported (ep.module() gives two Parameters over the
    one storage)."""
    first = {}
    for name, p in list(m.named_parameters(remove_duplicate=False)):
        key = (p.data_ptr(), tuple(p.shape), tuple(p.stride()))
        if key not in first:
            first[key] = p
            continue
        owner, _, leaf = name.rpartition(".")
        setattr(m.get_submodule(owner) if owner else m, leaf, first[key])
    return m


def user_inputs(ep):
    """The placeholders of the program's user inputs, in order."""
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [nodes[n] for n in names]


def static_batch(ep):
    """The program's batch when it is a fixed number, else None (a dynamic dimension)."""
    b = user_inputs(ep)[0].meta["val"].shape[0]
    return b if isinstance(b, int) else None


def state_of(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


# ---- data --------------------------------------------------------------------------------------

def make_data(out, n, seed, size="8"):
    torchscript_ref.make_data(out, n, seed, size)


class Data:
    """The training set as mpiddp reads it: an HDF5 classification set, or an llm.c shard cut into
    windows of T + 1 tokens (window i: tokens [i T, i T + T])."""

    def __init__(self, path, ep):
        self.tokens = None
        if h5py.is_hdf5(path):
            self.x, self.y = torchscript_ref.load_data(path)
            self.n = self.x.shape[0]
        else:
            self.tokens = nanogpt_ref.read_shard(path)
            self.t = user_inputs(ep)[0].meta["val"].shape[1]
            self.n = (self.tokens.numel() - 1) // self.t

    def take(self, idx):
        if self.tokens is not None:
            return nanogpt_ref.windows(self.tokens, self.t, idx)
        return self.x[idx], self.y[idx]


def reference(model, data, ranks, batch, steps, lr, momentum, out, clip="0", seed="0"):
    torch.set_num_threads(1)  # mpiddp's runs: --threads 1
    counts = [int(r) for r in ranks.split(",")]
    if len(counts) > 1 and "{ranks}" not in out:
        raise SystemExit("reference: a list of rank counts needs {ranks} in OUT")
    for n in counts:
        reference_one(model, data, n, int(batch), int(steps), float(lr), float(momentum),
                      out.replace("{ranks}", str(n)), float(clip), int(seed))


def reference_one(model, data, ranks, batch, steps, lr, momentum, out, clip, seed):
    ep = torch.export.load(model)  # afresh for each count: the module trains the program's own tensors
    m = tie_shared(ep.module())
    model_loss = len(user_inputs(ep)) == 2  # forward(inputs, targets) -> (outputs, loss): --loss model
    d = Data(data, ep)
    # mpiddp's sampler without shuffling: rank r takes r, r + RANKS, ...; padded by wrapping to
    # equal shares (PyTorch's DistributedSampler).
    n = d.n
    per_rank = -(-n // ranks)
    order = list(range(n)) + list(range(per_rank * ranks - n))
    mine = [order[r::ranks] for r in range(ranks)]
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    torch.manual_seed(seed)

    def loss_of(sl):
        x, y = d.take(sl)
        if model_loss:
            return m(x, y)[1]
        return F.cross_entropy(m(x), y)

    for s in range(steps):
        opt.zero_grad()
        slices = [mine[r][s * batch:(s + 1) * batch] for r in range(ranks)]
        kept = None
        for r, sl in enumerate(slices):
            # Each rank's slice is its own forward (BatchNorm normalises by that slice's
            # statistics); DDP averages the gradients: each loss / RANKS. The buffers after the
            # step are rank 0's (DDP broadcasts them).
            (loss_of(sl) / ranks).backward()
            if r == 0:
                kept = {k: b.clone() for k, b in m.named_buffers()}
        with torch.no_grad():
            for k, b in m.named_buffers():
                b.copy_(kept[k])
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    torch.save(state_of(m), out)
    print(f"reference {os.path.basename(model)} x {ranks} rank(s): {out}")


# ---- checks ------------------------------------------------------------------------------------

def compare(ref, exported, tol="1e-5"):
    torchscript_ref.compare(ref, exported, tol)


def example_inputs(ep):
    """The archive's sample inputs, else zeros of the program's input shapes (a dynamic size: 2)."""
    if ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
        return args, kwargs
    made = []
    for node in user_inputs(ep):
        v = node.meta["val"]
        shape = [s if isinstance(s, int) else 2 for s in v.shape]
        made.append(torch.zeros(shape, dtype=v.dtype))
    return tuple(made), {}


def check_export(ref, exported, tol="1e-5"):
    want = torchscript_ref.load_weights(ref)
    programs = load_programs(exported)
    for name, ep in programs.items():
        m = ep.module()
        got = m.state_dict()
        assert set(want) == set(got), f"{name}: names differ: {sorted(set(want) ^ set(got))}"
        worst = max((want[k].double() - got[k].double()).abs().max().item() for k in want)
        assert worst <= float(tol), f"{name}: max |difference| {worst} > {tol}"
        for k in want:
            assert want[k].dtype == got[k].dtype and want[k].shape == got[k].shape, f"{name}: {k} dtype or shape"
        args, kwargs = example_inputs(ep)
        with torch.no_grad():
            out = m(*args, **kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        assert all(torch.isfinite(o).all() for o in outs if isinstance(o, torch.Tensor)), f"{name}: not finite"
        print(f"program {name!r}: {len(got)} tensors within {worst:.3g} of the reference; runs on "
              f"{[tuple(a.shape) for a in args]}")
    print(f"{exported}: {', '.join(programs)} load with torch.export and hold the trained tensors")


def eval_loss(ref_state, model, data):
    torch.set_num_threads(1)
    programs = load_programs(model)
    ep = programs.get("eval", programs["model"])
    m = tie_shared(ep.module())
    m.load_state_dict(torch.load(ref_state), strict=True)
    x, y = torchscript_ref.load_data(data)
    chunk = static_batch(ep) or x.shape[0]
    assert x.shape[0] % chunk == 0, f"{x.shape[0]} samples do not split into batches of {chunk}"
    total = 0.0
    with torch.no_grad():
        for b in range(0, x.shape[0], chunk):
            total += F.cross_entropy(m(x[b:b + chunk]), y[b:b + chunk], reduction="sum").item()
    print(f"{total / x.shape[0]:.10f}")


# ---- archives mpiddp must refuse ---------------------------------------------------------------

def rewrite(good, out, change):
    """GOOD's entries, each passed through change(name, data) (None: left out), written in order
    with zipfile (ZIP_STORED), the names kept (under the archive's root folder)."""
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = change(info.filename, src.read(info.filename))
            if data is not None:
                dst.writestr(info.filename, data)


def edit_models(name, data, edit):
    if re.search(r"(^|/)models/[^/]+\.json$", name):
        d = json.loads(data)
        edit(d)
        return json.dumps(d).encode()
    return data


def make_bad(d, good):
    blob = open(good, "rb").read()
    with open(os.path.join(d, "truncated.pt2"), "wb") as f:
        f.write(blob[:len(blob) // 2])

    def major(d):
        d["schema_version"]["major"] += 1

    def unknown_op(d):
        node = next(n for n in d["graph_module"]["graph"]["nodes"] if n["target"].startswith("torch.ops.aten."))
        node["target"] = "torch.ops.aten.no_such_op.default"

    rewrite(good, os.path.join(d, "control.pt2"), lambda n, data: data)
    rewrite(good, os.path.join(d, "major.pt2"), lambda n, data: edit_models(n, data, major))
    rewrite(good, os.path.join(d, "unknown_op.pt2"), lambda n, data: edit_models(n, data, unknown_op))
    rewrite(good, os.path.join(d, "missing_blob.pt2"),
            lambda n, data: None if n.endswith("/data/weights/weight_0") else data)
    with zipfile.ZipFile(os.path.join(d, "other.pt2"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("other/notes.txt", "a zip archive, not a torch.export program\n")
    print("truncated.pt2 major.pt2 unknown_op.pt2 missing_blob.pt2 other.pt2 control.pt2")


def ops(*paths):
    """The call_function targets of every program in each archive, as models/NAME.json spells them."""
    for path in paths:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if re.search(r"(^|/)models/[^/]+\.json$", name):
                    nodes = json.loads(z.read(name))["graph_module"]["graph"]["nodes"]
                    print(f"{path} {name.split('/')[-1]}: {' '.join(sorted({n['target'] for n in nodes}))}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make-data": make_data, "make-model": make_model, "make-models": make_models, "reference": reference,
     "compare": compare, "check-export": check_export, "eval-loss": eval_loss, "make-bad": make_bad,
     "ops": ops}[cmd](*args)
