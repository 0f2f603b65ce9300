"""Python side of tests/system/gpt_cli.sh: nanoGPT's GPT and training loop, written here from the
published description (model.py and train.py of Karpathy's nanoGPT: names, initialisation, loss,
AdamW groups, get_lr, gradient accumulation, generate), used as the reference mpiddp must equal.
Runs on Debian's python3-torch 1.13 and on newer torch (the attention is the explicit form).

  init OUT.pt SEED L H C T V BIAS          a fresh GPT's state_dict (lm_head.weight is wte's tensor)
  train INIT.pt SHARD RANKS BATCH ACCUM STEPS LR MIN_LR WARMUP WD B1 B2 CLIP OUT.pt
      one process over the global batch, as mpiddp's N ranks see it without shuffling: rank r takes
      windows r, r + RANKS, ... (DistributedSampler's order, padded by wrapping), step s of rank r
      its next BATCH x ACCUM windows as ACCUM micro-batches. nanoGPT's loop: each of the
      RANKS x ACCUM micro-batch losses / (RANKS x ACCUM), backward, clip_grad_norm_(CLIP), AdamW with
      nanoGPT's groups (dim >= 2 decay, the rest not), lr by get_lr (warmup, cosine to MIN_LR over STEPS)
  compare REF.pt STATE_DICT.pt TOL         every tensor within TOL (max abs), lm_head tied to wte in both
  strict-load STATE_DICT.pt                loads into this GPT with load_state_dict(strict=True)
  loss STATE_DICT.pt SHARD T               mean cross-entropy over every position of every window
  generate STATE_DICT.pt PROMPT N [TOP_K TEMPERATURE SEED]
                                           continuation of the bytes of PROMPT: greedy (top_k=1) by
                                           default, else drawn after torch.manual_seed(SEED)
  script OUT.pt SEED L H C T V BIAS        the same GPT scripted, forward(idx, targets) -> (logits, loss);
                                           its initial state_dict in OUT.pt.init
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

LLMC_MAGIC, LLMC_VERSION = 20240520, 1


class Config:
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, bias=True, dropout=0.0):
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.block_size, self.vocab_size, self.bias, self.dropout = block_size, vocab_size, bias, dropout


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head, self.n_embd = c.n_head, c.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c.n_embd, c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c.n_embd, c.bias)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout),
            h=nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            ln_f=LayerNorm(c.n_embd, c.bias),
        ))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, fused=False):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        extra = {"fused": True} if fused else {}  # nanoGPT's choice on CUDA
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def read_shard(path):
    """llm.c's shard: 256 int32 of header (magic, version, count), then uint16 tokens."""
    data = open(path, "rb").read()
    header = torch.frombuffer(bytearray(data[:1024]), dtype=torch.int32)
    assert int(header[0]) == LLMC_MAGIC and int(header[1]) == LLMC_VERSION, path
    count = int(header[2])
    body = torch.frombuffer(bytearray(data[1024:1024 + 2 * count]), dtype=torch.int16).long()
    return body & 0xFFFF  # uint16


def windows(tokens, t, idx):
    rows = torch.stack([tokens[i * t:i * t + t + 1] for i in idx])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def config_from(args):
    l, h, c, t, v, bias = args
    return Config(int(l), int(h), int(c), int(t), int(v), bias=bias == "true")


def config_of_state(sd):
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    v, c = sd["transformer.wte.weight"].shape
    t = sd["transformer.wpe.weight"].shape[0]
    bias = "transformer.ln_f.bias" in sd
    # heads do not change a state_dict's shapes: the caller's config gives them
    return n_layer, c, t, v, bias


def model_from_state(path, n_head=2):
    sd = torch.load(path)
    n_layer, c, t, v, bias = config_of_state(sd)
    model = GPT(Config(n_layer, n_head, c, t, v, bias=bias))
    model.load_state_dict(sd, strict=True)
    return model


def init(out, seed, *shape):
    torch.manual_seed(int(seed))
    model = GPT(config_from(shape))
    torch.save(dict(model.state_dict()), out)  # a plain dict: libtorch's unpickler reads no OrderedDict


def train(init_path, shard, ranks, batch, accum, steps, lr, min_lr, warmup, wd, b1, b2, clip, out, n_head="2"):
    ranks, batch, accum, steps, warmup = int(ranks), int(batch), int(accum), int(steps), int(warmup)
    lr, min_lr, wd, clip = float(lr), float(min_lr), float(wd), float(clip)
    model = model_from_state(init_path, int(n_head))
    t = model.config.block_size
    tokens = read_shard(shard)
    n = (tokens.numel() - 1) // t
    order = list(range(n))
    order += order[:(-n) % ranks]  # DistributedSampler pads by wrapping
    per_rank = [order[r::ranks] for r in range(ranks)]
    opt = model.configure_optimizers(wd, lr, (float(b1), float(b2)))
    rows = batch * accum
    for it in range(steps):
        for group in opt.param_groups:
            group["lr"] = get_lr(it, lr, min_lr, warmup, steps)
        for r in range(ranks):
            mine = per_rank[r][it * rows:(it + 1) * rows]
            for j in range(accum):
                x, y = windows(tokens, t, mine[j * batch:(j + 1) * batch])
                _, loss = model(x, y)
                (loss / (ranks * accum)).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.save(model.state_dict(), out)


def compare(ref_path, got_path, tol):
    ref, got = torch.load(ref_path), torch.load(got_path)
    assert set(ref) == set(got), f"names differ: {sorted(set(ref) ^ set(got))}"
    worst = max((ref[k].float() - got[k].float()).abs().max().item() for k in ref)
    tied = torch.equal(got["lm_head.weight"], got["transformer.wte.weight"])
    print(f"max abs diff {worst:.3g} over {len(ref)} tensors; lm_head tied to wte: {tied}")
    if worst > float(tol) or not tied:
        sys.exit(1)


def strict_load(path, n_head="2"):
    model = model_from_state(path, int(n_head))
    assert model.lm_head.weight is model.transformer.wte.weight
    print(f"loaded {len(model.state_dict())} tensors strictly")


def loss(path, shard, t, n_head="2"):
    model = model_from_state(path, int(n_head)).eval()
    tokens = read_shard(shard)
    n = (tokens.numel() - 1) // int(t)
    total = 0.0
    with torch.no_grad():
        for b in range(0, n, 64):
            x, y = windows(tokens, int(t), range(b, min(n, b + 64)))
            total += model(x, y)[1].item() * x.size(0)
    print(f"{total / n:.8f}")


def generate(path, prompt, n, top_k="1", temperature="1.0", seed="1337", n_head="2"):
    model = model_from_state(path, int(n_head)).eval()
    idx = torch.tensor([list(prompt.encode())], dtype=torch.long)
    torch.manual_seed(int(seed))
    out = model.generate(idx, int(n), temperature=float(temperature), top_k=int(top_k) or None)
    sys.stdout.buffer.write(bytes(out[0].tolist()))


class ScriptedGPT(GPT):
    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def script(out, seed, *shape):
    torch.manual_seed(int(seed))
    model = ScriptedGPT(config_from(shape))
    torch.save(dict(model.state_dict()), out + ".init")
    torch.jit.script(model).save(out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    commands = {"init": init, "train": train, "compare": compare, "strict-load": strict_load, "loss": loss,
                "generate": generate, "script": script}
    commands[sys.argv[1]](*sys.argv[2:])
