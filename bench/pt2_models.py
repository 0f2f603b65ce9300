"""The models of bench/pt2_bench.sh, each saved twice from one Python module: as TorchScript
(torch.jit.script(m).save) and as a torch.export program (torch.export.export(m.train(), ...),
torch.export.save; with dropout its eval-mode program beside it in the one archive, as
tests/python/pt2_ref.py saves them). Needs torch >= 2.6 (the pip venv's 2.11, sid's 2.14).

  make DIR SEED PART...   PART cnn: PyTorch's MNIST example Net (tests/python/torchscript_ref.py's
                          MnistNet) returning logits, as mpiddp's built-in --model cnn does ->
                          DIR/cnn.pt, DIR/cnn.pt2 (the batch dynamic)
                          PART mlp:IN,OUT: mpiddp's built-in --model mlp (fc1, fc2, fc3 with ReLUs) on
                          IN features -> DIR/mlp.pt, DIR/mlp.pt2 (the batch dynamic): a model so
                          small that the step is mostly per-op overhead
                          PART gpt:L,H,C,T,V: nanoGPT's GPT (tests/python/nanogpt_ref.py's, attention
                          by F.scaled_dot_product_attention(is_causal=True) as nanoGPT's model.py
                          takes it on torch >= 2.0 and mpiddp's built-in --model gpt does),
                          forward(idx, targets) -> (logits, loss) for --loss model -> DIR/gpt.pt,
                          DIR/gpt.pt2 (the batch dynamic, T fixed)
  Also DIR/models.json: per part, the call_function nodes of the exported training program (what
  mpiddp's executor dispatches one by one in a forward) and the parameters.
"""
import inspect
import json
import os
import sys
import warnings

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import nanogpt_ref  # noqa: E402  (nanoGPT's GPT)
import pt2_ref  # noqa: E402  (save_programs: train and eval programs in one archive)
import torchscript_ref  # noqa: E402  (MnistNet: PyTorch's examples/mnist Net)

warnings.filterwarnings("ignore", message="The given buffer is not writable")


class MnistLogits(torchscript_ref.MnistNet):
    """The example's Net returning its logits, as mpiddp's built-in cnn does (the example's
    log_softmax + nll_loss is the cross-entropy the trainer applies): the same ops in all three."""

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        return self.fc2(self.dropout2(F.relu(self.fc1(x))))


class ToyMlp(torch.nn.Module):
    """mpiddp's built-in --model mlp: Linear(in, 128), ReLU, Linear(128, 64), ReLU, Linear(64, out)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc1 = torch.nn.Linear(n_in, 128)
        self.fc2 = torch.nn.Linear(128, 64)
        self.fc3 = torch.nn.Linear(64, n_out)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class SdpaAttention(nanogpt_ref.CausalSelfAttention):
    """nanoGPT's attention on its flash path (model.py, torch >= 2.0): one fused SDPA call."""

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def build(part):
    """(name, module, example inputs, dynamic_shapes) of PART."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    if part == "cnn":
        m = MnistLogits()
        (arg,) = list(inspect.signature(m.forward).parameters)  # forward(self, x)
        return "cnn", m, (torch.randn(4, 1, 28, 28),), {arg: {0: batch}}
    if part.startswith("mlp:"):
        n_in, n_out = (int(a) for a in part[4:].split(","))
        m = ToyMlp(n_in, n_out)
        (arg,) = list(inspect.signature(m.forward).parameters)
        return "mlp", m, (torch.randn(4, n_in),), {arg: {0: batch}}
    if part.startswith("gpt:"):
        L, H, C, T, V = (int(a) for a in part[4:].split(","))
        m = nanogpt_ref.ScriptedGPT(nanogpt_ref.Config(L, H, C, T, V, bias=True, dropout=0.0))
        for block in m.transformer.h:
            block.attn.__class__ = SdpaAttention
        idx = torch.randint(0, V, (2, T))
        names = list(inspect.signature(m.forward).parameters)  # forward(self, idx, targets)
        return "gpt", m, (idx, torch.roll(idx, -1, 1)), {n: {0: batch} for n in names}
    raise SystemExit(f"pt2_models.py: unknown part '{part}' (cnn, mlp:IN,OUT, gpt:L,H,C,T,V)")


def make(directory, seed, *parts):
    if not pt2_ref.version_ok():
        raise SystemExit(f"pt2_models.py: torch {torch.__version__} has no torch.export archive (2.6 or newer)")
    os.makedirs(directory, exist_ok=True)
    info = {}
    for part in parts:
        torch.manual_seed(int(seed))
        name, m, example, dynamic = build(part)
        torch.jit.script(m).save(os.path.join(directory, name + ".pt"))
        m.train()
        programs = {"model": torch.export.export(m, example, dynamic_shapes=dynamic)}
        m.eval()
        evaluation = torch.export.export(m, example, dynamic_shapes=dynamic)
        m.train()
        if str(evaluation.graph) != str(programs["model"].graph):  # dropout: an eval program too
            programs["eval"] = evaluation
        pt2_ref.save_programs(programs, os.path.join(directory, name + ".pt2"))
        nodes = [n for n in programs["model"].graph.nodes if n.op == "call_function"]
        info[name] = {"torch": torch.__version__, "programs": sorted(programs),
                      "forward_nodes": len(nodes), "ops": len({str(n.target) for n in nodes}),
                      "parameters": sum(p.numel() for p in m.parameters())}
        print(f"pt2_models.py: {name}.pt and {name}.pt2 ({', '.join(sorted(programs))}): "
              f"{len(nodes)} call_function nodes in the training forward, {info[name]['parameters']} parameters",
              file=sys.stderr)
    with open(os.path.join(directory, "models.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "make":
        raise SystemExit(__doc__)
    make(*sys.argv[2:])
