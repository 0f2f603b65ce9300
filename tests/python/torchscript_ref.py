"""Python side of tests/system/torchscript_cli.sh: makes TorchScript models and data, trains the
reference in Python (Debian's python3-torch) and compares with what mpiddp trained and exported.

  make-data OUT.h5 N SEED            classification set in mpiddp's layout: [N, 1, 8, 8] float32, 4 classes
  make-model KIND OUT.pt SEED        KIND: plain (conv, linear) | bn (conv, BatchNorm, linear) | resnet18
  reference MODEL.pt DATA.h5 RANKS BATCH STEPS LR MOMENTUM OUT.pt
      SGD on the global batch RANKS x BATCH for STEPS steps, in the order mpiddp's sampler gives
      without shuffling (rank r takes samples r, r + RANKS, ...). Without BatchNorm that is one
      forward of the global batch. With it, it is what DDP computes: each rank's slice is its own
      batch (its own batch statistics), the gradients are averaged, and the buffers are rank 0's.
  compare REF.pt STATE_DICT.pt [TOL]  the exported state_dict equals the reference's (max abs diff)
  check-script REF.pt EXPORTED.pt DATA.h5   torch.jit.load of the export: same tensors, same outputs
  make-bad DIR                      modules that mpiddp must refuse (no forward, wrong outputs, wrong inputs)
  eval-loss REF.pt DATA.h5           evaluation-mode mean cross-entropy of the reference on DATA
"""
import sys

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_data(path):
    with h5py.File(path, "r") as f:
        return torch.from_numpy(f["inputs"][()]), torch.from_numpy(f["targets"][()])


def make_data(out, n, seed):
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(int(n), 1, 8, 8, generator=g)
    y = (x[:, 0, :4, :].sum((1, 2)) > 0).long() * 2 + (x[:, 0, 4:, :].sum((1, 2)) > 0).long()
    with h5py.File(out, "w") as f:
        f["inputs"] = x.numpy()
        f["targets"] = y.numpy()
        f.attrs["num_classes"] = 4


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


def reference(model, data, ranks, batch, steps, lr, momentum, out):
    ranks, batch, steps = int(ranks), int(batch), int(steps)
    m = torch.jit.load(model)
    m.train()
    x, y = load_data(data)
    n = x.shape[0]
    per_rank = -(-n // ranks)
    order = list(range(n)) + list(range(per_rank * ranks - n))
    mine = [order[r::ranks] for r in range(ranks)]
    has_bn = any(True for _ in m.named_buffers())
    opt = torch.optim.SGD(m.parameters(), lr=float(lr), momentum=float(momentum))
    for s in range(steps):
        opt.zero_grad()
        slices = [mine[r][s * batch:(s + 1) * batch] for r in range(ranks)]
        if not has_bn:
            idx = [i for sl in slices for i in sl]
            F.cross_entropy(m(x[idx]), y[idx]).backward()
        else:
            kept = None
            for r, sl in enumerate(slices):
                (F.cross_entropy(m(x[sl]), y[sl]) / ranks).backward()
                if r == 0:
                    kept = {k: b.clone() for k, b in m.named_buffers()}
            with torch.no_grad():
                for k, b in m.named_buffers():
                    b.copy_(kept[k])
        opt.step()
    torch.save({k: v.detach().clone() for k, v in m.state_dict().items()}, out)


def compare(ref, exported, tol="1e-5"):
    a = torch.load(ref)
    b = torch.load(exported)
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
     "check-script": check_script, "make-bad": make_bad, "eval-loss": eval_loss}[cmd](*args)
