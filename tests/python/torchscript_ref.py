"""Python side of tests/system/torchscript_cli.sh: makes TorchScript models and data, trains the
reference in Python (Debian's python3-torch) and compares with what mpiddp trained and exported.

  make-data OUT.h5 N SEED [SIZE]     classification set in mpiddp's layout: [N, 1, SIZE, SIZE] float32,
                                     4 classes used (of 4 at SIZE 8, of 10 otherwise)
  make-model KIND OUT.pt SEED        KIND: plain (conv, linear) | bn (conv, BatchNorm, linear) | resnet18
  reference MODEL.pt DATA.h5 RANKS BATCH STEPS LR MOMENTUM OUT.pt [CLIP [PRECISION [LOSS_SCALE]]]
      SGD on the global batch RANKS x BATCH for STEPS steps, in the order mpiddp's sampler gives
      without shuffling (rank r takes samples r, r + RANKS, ...). CLIP > 0: clip_grad_norm_.
      Without BatchNorm or autocast that is one forward of the global batch. Otherwise it is what
      DDP computes: each rank's slice is its own forward (its own batch statistics, its own
      autocast), the gradients are averaged, and the buffers are rank 0's. PRECISION bf16 or fp16:
      forward under torch.autocast("cpu"), loss in float32; fp16 with torch.amp.GradScaler
      (initial scale LOSS_SCALE), each slice's scaled loss backward, the sum / RANKS, then
      scaler.step and update. OUT.pt.json gets the final loss scale and the skipped steps.
  compare REF.pt STATE_DICT.pt [TOL]  the exported state_dict equals the reference's (max abs diff)
  check-script REF.pt EXPORTED.pt DATA.h5   torch.jit.load of the export: same tensors, same outputs
  make-bad DIR                      modules that mpiddp must refuse (no forward, wrong outputs, wrong inputs)
  check-mnist-net STATE.pt DATA.h5 LOSS   the built-in cnn's export loads into examples/mnist's Net
  eval-loss REF.pt DATA.h5           evaluation-mode mean cross-entropy of the reference on DATA
"""
import json
import sys

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_data(path):
    with h5py.File(path, "r") as f:
        return torch.from_numpy(f["inputs"][()]), torch.from_numpy(f["targets"][()])


def make_data(out, n, seed, size="8"):
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(int(n), 1, int(size), int(size), generator=g)
    h = int(size) // 2
    y = (x[:, 0, :h, :].sum((1, 2)) > 0).long() * 2 + (x[:, 0, h:, :].sum((1, 2)) > 0).long()
    classes = 4 if int(size) == 8 else 10  # the built-in cnn wants 10 classes (6 of them unused here)
    with h5py.File(out, "w") as f:
        f["inputs"] = x.numpy()
        f["targets"] = y.numpy()
        f.attrs["num_classes"] = classes


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class NoForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))

    @torch.jit.export
    def score(self, x):
        return x * self.w


class Head(nn.Module):  # Linear(features, out) on the flattened inputs, optionally summed to [N]
    def __init__(self, features: int, out: int, sum_outputs: bool):
        super().__init__()
        self.fc = nn.Linear(features, out)
        self.sum_outputs = sum_outputs

    def forward(self, x):
        y = self.fc(x.flatten(1))
        return y.sum(1) if self.sum_outputs else y


def make_bad(d):
    torch.jit.script(NoForward()).save(d + "/noforward.pt")
    torch.jit.script(Head(64, 3, False)).save(d + "/three.pt")   # 3 classes where the labels have 4
    torch.jit.script(Head(64, 4, True)).save(d + "/flat.pt")     # outputs [N], not [N, classes]
    torch.jit.script(Head(20, 4, False)).save(d + "/other.pt")   # takes 20 features, not 64


def make_model(kind, out, seed):
    torch.manual_seed(int(seed))
    if kind == "plain":
        m = Plain()
    elif kind == "bn":
        m = WithBatchNorm()
    elif kind == "resnet18":
        import torchvision
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)  # one channel
    else:
        raise SystemExit("unknown kind " + kind)
    torch.jit.script(m).save(out)


def reference(model, data, ranks, batch, steps, lr, momentum, out, clip="0", precision="fp32", loss_scale="65536"):
    ranks, batch, steps, clip = int(ranks), int(batch), int(steps), float(clip)
    m = torch.jit.load(model)
    m.train()
    x, y = load_data(data)
    n = x.shape[0]
    per_rank = -(-n // ranks)
    order = list(range(n)) + list(range(per_rank * ranks - n))
    mine = [order[r::ranks] for r in range(ranks)]
    has_bn = any(True for _ in m.named_buffers())
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler("cpu", init_scale=float(loss_scale)) if precision == "fp16" else None
    opt = torch.optim.SGD(m.parameters(), lr=float(lr), momentum=float(momentum))
    skipped = 0

    def loss_of(sl):
        if dtype is None:
            return F.cross_entropy(m(x[sl]), y[sl])
        with torch.autocast("cpu", dtype=dtype):
            out = m(x[sl])
        return F.cross_entropy(out.float(), y[sl])

    for s in range(steps):
        opt.zero_grad()
        slices = [mine[r][s * batch:(s + 1) * batch] for r in range(ranks)]
        if not has_bn and dtype is None:
            idx = [i for sl in slices for i in sl]
            F.cross_entropy(m(x[idx]), y[idx]).backward()
        else:
            kept = None
            for r, sl in enumerate(slices):
                if scaler is not None:  # scaled as each rank scales its loss; averaged below, as DDP does
                    scaler.scale(loss_of(sl)).backward()
                else:
                    (loss_of(sl) / ranks).backward()
                if r == 0:
                    kept = {k: b.clone() for k, b in m.named_buffers()}
            with torch.no_grad():
                for k, b in m.named_buffers():
                    b.copy_(kept[k])
                if scaler is not None:
                    for p in m.parameters():
                        p.grad /= ranks
        if scaler is not None:
            scaler.unscale_(opt)
            found_inf = sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0
            if not found_inf and clip > 0:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            skipped += int(found_inf)
            scaler.step(opt)
            scaler.update()
            continue
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    torch.save({k: v.detach().clone() for k, v in m.state_dict().items()}, out)
    with open(out + ".json", "w") as f:
        json.dump({"loss_scale": scaler.get_scale() if scaler else None, "skipped_steps": skipped}, f)


def load_weights(path):
    """torch.load as a careful user calls it: weights_only=True where this PyTorch has it (the
    default from 2.6), so an export that needs more than tensors and dicts fails here."""
    try:
        return torch.load(path, weights_only=True)
    except TypeError:  # PyTorch < 1.13 has no weights_only
        return torch.load(path)


def compare(ref, exported, tol="1e-5"):
    a = torch.load(ref)
    b = load_weights(exported)
    assert set(a) == set(b), f"names differ: {sorted(set(a) ^ set(b))}"
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    print(f"max |difference| over {len(a)} tensors: {worst:.3g}")
    assert worst <= float(tol), f"{worst} > {tol}"


def check_script(ref, exported, data):
    a = torch.load(ref)
    m = torch.jit.load(exported)
    sd = m.state_dict()
    assert set(a) == set(sd), f"names differ: {sorted(set(a) ^ set(sd))}"
    for k in a:
        assert torch.equal(a[k].to(sd[k].dtype), sd[k]) or (a[k].double() - sd[k].double()).abs().max() <= 1e-5, k
    m.eval()
    x, _ = load_data(data)
    out = m(x[:16])
    assert out.shape == (16, 4) and torch.isfinite(out).all()
    print("exported TorchScript module loads, holds the trained tensors and runs")


class MnistNet(nn.Module):  # PyTorch's examples/mnist Net, as written there
    def __init__(self):
        super(MnistNet, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def check_mnist_net(state, data, want_loss):
    """The built-in cnn's state_dict loads into the Python Net (strict) and gives mpiddp's test loss."""
    m = MnistNet()
    m.load_state_dict(load_weights(state))
    m.eval()
    x, y = load_data(data)
    with torch.no_grad():
        loss = F.nll_loss(m(x), y).item()
    print(f"examples/mnist Net loads the export; test loss {loss:.8f} (mpiddp: {float(want_loss):.8f})")
    assert abs(loss - float(want_loss)) <= 1e-5 * max(1.0, abs(loss))


def eval_loss(ref_state, model, data):
    m = torch.jit.load(model)
    m.load_state_dict(torch.load(ref_state))
    m.eval()
    x, y = load_data(data)
    with torch.no_grad():
        print(f"{F.cross_entropy(m(x), y).item():.10f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make-data": make_data, "make-model": make_model, "reference": reference, "compare": compare,
     "check-script": check_script, "make-bad": make_bad, "check-mnist-net": check_mnist_net, "eval-loss": eval_loss}[cmd](*args)
