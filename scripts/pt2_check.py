#!/usr/bin/env python3
"""Find, before torch.export, what `mpiddp train --model FILE.pt2` cannot train faithfully (docs/pt2.md).
    python scripts/pt2_check.py mymodel.py:make_model --example 8,784 [--dynamic-batch] [--save model.pt2]
FACTORY returns a model, or (model, example_inputs); for a model alone, each --example SHAPE is a float32 randn
input. One line per finding and exit 1, else "ok: N ops, M parameters, K buffers" and exit 0. check() for Python.
"""
import argparse, collections, contextlib, importlib.util, os, sys, tempfile, warnings
import torch
import torch.nn.attention.flex_attention as flex
import torch.utils.checkpoint as ckpt  # checkpoint_sequential calls checkpoint

EXECUTOR_HOPS = {"cond", "while_loop", "wrap_with_set_grad_enabled", "wrap_with_autocast"}
# symbolic-shape arithmetic, as src/pt2/pt2_program.cpp's symbolic_ops(); getitem (never serialized)
SYMBOLIC = {f"_operator.{o}" for o in
            "add sub mul floordiv mod truediv pow neg pos eq ne lt le gt ge and_ or_ not_ lshift rshift".split()}
SYMBOLIC |= {"_operator.getitem", "torch.sym_not", "torch.sym_max", "torch.sym_min", "torch.sym_float",
             "torch.sym_int", "torch.sym_ite", "torch._sym_sqrt", "math.ceil", "math.floor", "math.trunc"}
LOSSY = [(ckpt, "checkpoint", "torch.utils.checkpoint", "export inlines it, no recompute"),
         (flex, "flex_attention", "flex_attention", "torch.export.save fails on it in the training IR")]


def _n(count, word):
    return f"{count} {word}{'s' if count != 1 else ''}"


@contextlib.contextmanager
def _counted(owner, name, counts, model):
    """Count calls of owner.name, also where the model's modules imported it by name."""
    orig = getattr(owner, name)
    def counting(*a, **kw):
        counts[name] += 1
        return orig(*a, **kw)
    spots = [(owner, name)] + [(mod, k) for mod in {sys.modules.get(type(m).__module__) for m in model.modules()}
                               if mod not in (None, owner) for k, v in vars(mod).items() if v is orig]
    for o, k in spots:
        setattr(o, k, counting)
    try:
        yield
    finally:
        for o, k in spots:
            setattr(o, k, orig)


def _forward_findings(model, inputs):
    """One forward (train mode, no_grad) with the lossy entry points counted; buffers and RNG restored."""
    counts, functions = collections.Counter(), collections.Counter()
    orig_apply = torch.autograd.Function.__dict__["apply"].__func__
    def apply(cls, *a, **kw):
        if not cls.__module__.startswith("torch."):  # torch's own (checkpoint's: counted as checkpoint)
            functions[f"{cls.__module__}.{cls.__qualname__}"] += 1
        return orig_apply(cls, *a, **kw)
    saved = {k: b.detach().clone() for k, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[]), torch.no_grad(), contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        for owner, name, _, _ in LOSSY:
            stack.enter_context(_counted(owner, name, counts, model))
        torch.autograd.Function.apply = classmethod(apply)
        stack.callback(setattr, torch.autograd.Function, "apply", classmethod(orig_apply))
        model(*inputs)
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(saved[k])
    return [f"autograd.Function {f} ({_n(c, 'call')}): export inlines its forward, its backward is lost"
            for f, c in sorted(functions.items())] + \
        [f"{what} ({_n(counts[key], 'call')}): {why}" for _, key, what, why in LOSSY if counts[key]]


def _unrunnable(target):
    """None for what mpiddp's executor runs (docs/pt2.md), else the op's name."""
    if isinstance(target, torch._ops.OpOverload):
        return None if target.namespace in ("aten", "prims") else str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return None if target.name() in EXECUTOR_HOPS else f"higher-order op {target.name()}"
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', target)}"
    return None if name in SYMBOLIC else name


def _failed(what, e):
    return f"{what} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def check(model, example_inputs, dynamic_shapes=None, save=None, eval_program=False):
    """(findings, summary): export model (train mode) to a temporary .pt2 and load it back. With save and
    no findings, write the archive there; with eval_program, model.eval()'s program too, named `eval`."""
    model.train()
    inputs = tuple(example_inputs)
    try:
        findings = _forward_findings(model, inputs)
    except Exception as e:
        return [_failed("forward", e)], None
    try:
        ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as e:
        return findings + [_failed("torch.export.export", e)], None
    targets = [n.target for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)
               for n in gm.graph.nodes if n.op == "call_function"]  # cond's and while_loop's subgraphs too
    unknown = collections.Counter(filter(None, map(_unrunnable, targets)))
    findings += [f"op not run by mpiddp's executor: {op} ({_n(c, 'node')})" for op, c in sorted(unknown.items())]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # load's "buffer is not writable"
        try:
            torch.export.save(ep, os.path.join(tmp, "model.pt2"))
            torch.export.load(os.path.join(tmp, "model.pt2"))
        except Exception as e:
            return findings + [_failed("torch.export.save/load", e)], None
    if save and not findings and not eval_program:
        torch.export.save(ep, save)
    elif save and not findings:
        from torch.export.pt2_archive._package import package_pt2  # what torch.export.save calls
        ev = torch.export.export(model.eval(), inputs, dynamic_shapes=dynamic_shapes)
        package_pt2(save, exported_programs={"model": ep, "eval": ev})  # save writes "model" alone
        model.train()
    sig = ep.graph_signature
    return findings, f"ok: {len(targets)} ops, {len(sig.parameters)} parameters, {len(sig.buffers)} buffers"


def _factory(spec):
    where, _, name = spec.rpartition(":")
    sys.path.insert(0, os.path.dirname(os.path.abspath(where)))  # its own imports
    s = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
    sys.modules[s.name] = mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return getattr(mod, name)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("factory", help="FILE.py:FACTORY, a function returning a model or (model, inputs)")
    p.add_argument("--example", action="append", default=[], metavar="SHAPE",
                   help="a float32 randn input of this shape, e.g. 8,784 (repeat for more inputs)")
    p.add_argument("--dynamic-batch", action="store_true", help="declare dim 0 of every input dynamic")
    p.add_argument("--save", metavar="OUT.pt2", help="write the archive when nothing was found")
    p.add_argument("--eval-program", action="store_true", help="--save adds model.eval()'s program, `eval`")
    a = p.parse_args()
    made = _factory(a.factory)()
    model, inputs = made if isinstance(made, tuple) else (made, None)
    if inputs is None and not a.example:
        p.error("the factory returned a model alone: give --example SHAPE")
    if inputs is None:
        inputs = [torch.randn(*[int(d) for d in s.split(",")]) for s in a.example]
    batch = torch.export.Dim("batch")
    dyn = tuple({0: batch} if torch.is_tensor(x) else None for x in inputs) if a.dynamic_batch else None
    findings, summary = check(model, inputs, dyn, a.save, a.eval_program)
    print("\n".join(findings) or summary + (f"; wrote {a.save}" if a.save else ""))
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
