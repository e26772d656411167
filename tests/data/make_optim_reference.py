#!/usr/bin/env python3
"""Reference trajectories of real PyTorch ``torch.optim`` optimizers on a tiny scalar MLP.

What it computes
----------------
A 3-4-1 tanh MLP written with scalar torch ops (every param a separate 0-d float64 tensor,
no nn.Linear / matmul), trained full-batch on 8 samples for 100 steps by each of 7
optimizer configurations (SGD, SGD+momentum+dampening, SGD Nesterov + weight decay, Adam,
Adam + L2 weight decay, AdamW, AdamW with a per-step lr schedule). For every run it records
the loss of each step (before that step's update), the 21 params after the last step and
the optimizer state after the last step, in param creation order. The output is one JSON
object on stdout; tapejit's optimizer tests compare against it without torch.

Rerun (from the repo root; needs torch and numpy, NOT in the repo's own venv):

    python3 -m venv /work/torchenv && /work/torchenv/bin/pip install torch numpy
    /work/torchenv/bin/python tests/data/make_optim_reference.py > tests/data/optim_reference.json

The committed JSON was made with torch 2.15.0 (the PyPI wheel 2.15.0+cu132, run on the CPU)
on Linux x86-64 (glibc 2.36). The script is deterministic: no torch RNG; init and data come
from Python's random.Random(20261126). Two runs give byte-identical output.

The script forces ATen's portable kernels (ATEN_CPU_CAPABILITY=default, set before torch
is imported, recorded in the JSON as "cpu_capability"). Reason: under the AVX2/AVX512
builds of the same kernels, PyTorch computes even 1-element float64 tensors with fused
multiply-adds (checked on this torch: `add(x, alpha=a)` == fma(a, x, self),
`lerp` == fma(w, end-self, self) / fma(w-1, end-self, end), `addcmul` ==
fma(value*t1, t2, self)), so the bits would depend on the machine. With "default" every
kernel computes exactly the scalar C++ expression quoted below, which is what a scalar
implementation can mirror. Two things stay machine/library dependent even then: `sqrt`
and `tanh` of float64 go through MKL VML (vdSqrt / vdTanh in VML_HA mode, <= 1 ulp, not
correctly rounded): torch's sqrt differs from the correctly rounded math.sqrt by 1 ulp for
about 1% of inputs (98 of the 8400 sqrts in these runs), its tanh from glibc's tanh for
about 30% (6751 of 22400 here). Running the same script under AVX2 instead changes the
results by at most ~1e-14 relative (params) / ~1.3e-14 (losses).

Self-check: while it trains, the script replays every optimizer step in plain Python
floats with the formulas below (fed torch's gradients, with torch's own sqrt of a 0-d
tensor for the one sqrt) and asserts that params and state agree with torch bit for bit
after every step; it also replays the forward pass (with torch's tanh) and asserts the loss
bits. It reports on stderr how often math.sqrt / math.tanh would have differed.

Order of floating-point operations (torch 2.15.0, read in the installed
torch/optim/{sgd,adam,adamw}.py, single-tensor implementations, and verified bitwise
by the self-check above). Hyperparameters are Python floats; `x op= y` on a tensor.
`p` param, `g` = p.grad, state per param.

SGD  (`_single_tensor_sgd`):
    if weight_decay != 0:  grad = grad.add(param, alpha=weight_decay)     # g = g + wd*p
    if momentum != 0:
        if buf is None:    buf = grad.detach().clone()                    # first step: b = g
        else:              buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                                                     # b = (b*mu) + (1-damp)*g   (1-damp in f64)
        if nesterov:       grad = grad.add(buf, alpha=momentum)           # g = g + mu*b
        else:              grad = buf
    param.add_(grad, alpha=-lr)                                           # p = p + (-lr)*g
  (dampening is not applied on the first step: the buffer is a plain clone of g.)

Adam (`_single_tensor_adam`, decoupled_weight_decay=False; capturable/differentiable off):
    step_t += 1                                  # state["step"], a float64 0-d tensor
    if weight_decay != 0: grad = grad.add(param, alpha=weight_decay)      # g = g + wd*p
    exp_avg.lerp_(grad, 1 - beta1)               # weight w = 1-beta1 computed in f64
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                                                 # v = (v*b2) + ((1-b2)*g)*g
    step = _get_value(step_t)                    # step_t.item(): a Python float
    bias_correction1 = 1 - beta1**step           # Python float ** float  (C pow())
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2**0.5   # Python float ** 0.5, i.e. C pow(x, 0.5),
                                                    # NOT math.sqrt (differs in rare cases,
                                                    # none in these runs: first for beta2=0.999
                                                    # is step 1270)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                                                 # d = (sqrt(v) / c2s) + eps   (true division)
    param.addcdiv_(exp_avg, denom, value=-step_size)
                                                 # p = p + ((-step_size)*m) / d

AdamW (class AdamW(Adam) with decoupled_weight_decay=True; same function):
    step_t += 1
    param.mul_(1 - lr * weight_decay)            # p = p * (1 - lr*wd), before everything else
    then Adam's lines without the `grad.add(param, ...)` term.

ATen CPU kernels (the scalar lambdas; with ATEN_CPU_CAPABILITY=default these are what runs,
checked bitwise on 20000 random inputs each):
  aten/src/ATen/native/ufunc/add.h (add/sub with alpha):
      T add(T self, T other, T alpha) { return self + alpha * other; }
      Vectorized<T> add(...) { return vec::fmadd(other, alpha, self); }   # AVX2/512 path
  aten/src/ATen/native/Lerp.h:
      return is_lerp_weight_small(weight)            // std::abs(weight) < 0.5
          ? self + weight * (end - self)
          : end - (end - self) * (opmath_t(1) - weight);
    (vectorized lerp_vec in cpu/LerpKernel.cpp: coeff = small ? w : w - 1,
     base = small ? start : end, vec::fmadd(coeff, end - start, base))
  aten/src/ATen/native/cpu/PointwiseOpsKernel.cpp:
      addcmul: return self_val + scalar_val * t1_val * t2_val;   // self + ((value*t1)*t2)
      addcdiv: return self_val + scalar_val * t1_val / t2_val;   // self + ((value*t1)/t2)
    i.e. value*t1 first, then *t2 or /t2 (NOT value*(t1/t2)), then + self.
  div by a Python float (cpu/BinaryOpsKernel.cpp div_true_kernel): a / b (the
    multiply-by-reciprocal path is only for reduced float types).
  mul_ by a Python float: a * b.  sqrt, tanh: at::vml -> MKL vdSqrt / vdTanh (VML_HA).

Model (the order of operations is that of a scalar graph): hidden j = 0..3:
    h_j = tanh(((w_j0*x0 + w_j1*x1) + w_j2*x2) + b_j)
    out = ((((v0*h0 + v1*h1) + v2*h2) + v3*h3) + c)
    loss = ((((d_0**2 + d_1**2) + d_2**2) + ... + d_7**2) * 0.125,  d_s = out_s - y_s
(torch's x**2 is x*x.) Params in creation order: w00,w01,w02,b0, w10,..,b1, w20,..,b2,
w30,..,b3, v0,v1,v2,v3, c. Init: weights uniform(-1,1), biases 0.1*uniform(-1,1), drawn in
that order from random.Random(20261126); then 8 samples, x: 3 draws of uniform(-2,2) each,
y = sin(x0) + 0.5*x1*x2 (Python math). "grad_init" in the JSON is torch's gradient at the
initial params (informational). Checked once, at the init only: it equals, bit for bit,
a plain-float backward pass with dout = 0.125*(2*d), dpre = dh*(1 - h*h), dw = dpre*x,
whose per-sample contributions to a param are summed in REVERSE sample order
(((g_7 + g_6) + g_5) + ... + g_0): torch's autograd accumulates the last-built use first.
"""
import json
import math
import os
import random
import sys

os.environ["ATEN_CPU_CAPABILITY"] = "default"

import torch  # noqa: E402

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

SEED = 20261126
STEPS = 100
SIZES = [3, 4, 1]


def make_problem():
    rng = random.Random(SEED)
    init = []
    for _ in range(4):
        init += [rng.uniform(-1, 1) for _ in range(3)]
        init.append(0.1 * rng.uniform(-1, 1))
    init += [rng.uniform(-1, 1) for _ in range(4)]
    init.append(0.1 * rng.uniform(-1, 1))
    xs, ys = [], []
    for _ in range(8):
        x = [rng.uniform(-2, 2) for _ in range(3)]
        xs.append(x)
        ys.append(math.sin(x[0]) + 0.5 * x[1] * x[2])
    return init, xs, ys


INIT, XS, YS = make_problem()


def torch_loss(params):
    w = [params[4 * j: 4 * j + 3] for j in range(4)]
    b = [params[4 * j + 3] for j in range(4)]
    v = params[16:20]
    c = params[20]
    total = None
    for x, y in zip(XS, YS):
        h = [torch.tanh(((w[j][0] * x[0] + w[j][1] * x[1]) + w[j][2] * x[2]) + b[j]) for j in range(4)]
        out = ((((v[0] * h[0] + v[1] * h[1]) + v[2] * h[2]) + v[3] * h[3]) + c)
        sq = (out - y) ** 2
        total = sq if total is None else total + sq
    return total * 0.125


# ---- plain-float mirror, used only for the self-check -------------------------------------
COUNT = {"tanh_evals": 0, "tanh_differs_from_math_tanh": 0,
         "sqrt_evals": 0, "sqrt_differs_from_math_sqrt": 0}


def t_tanh(a):
    r = torch.tanh(torch.tensor(a)).item()
    COUNT["tanh_evals"] += 1
    COUNT["tanh_differs_from_math_tanh"] += r != math.tanh(a)
    return r


def t_sqrt(a):
    r = torch.tensor(a).sqrt().item()
    COUNT["sqrt_evals"] += 1
    COUNT["sqrt_differs_from_math_sqrt"] += r != math.sqrt(a)
    return r


def mirror_loss(p):
    total = None
    for x, y in zip(XS, YS):
        h = [t_tanh(((p[4 * j] * x[0] + p[4 * j + 1] * x[1]) + p[4 * j + 2] * x[2]) + p[4 * j + 3])
             for j in range(4)]
        out = ((((p[16] * h[0] + p[17] * h[1]) + p[18] * h[2]) + p[19] * h[3]) + p[20])
        d = out - y
        sq = d * d
        total = sq if total is None else total + sq
    return total * 0.125


def lerp(a, b, w):
    return a + w * (b - a) if abs(w) < 0.5 else b - (b - a) * (1.0 - w)


def mirror_sgd(p, g, st, o):
    lr, wd = o["lr"], o.get("weight_decay", 0.0)
    mu, damp, nest = o.get("momentum", 0.0), o.get("dampening", 0.0), o.get("nesterov", False)
    for i in range(len(p)):
        gi = g[i]
        if wd != 0:
            gi = gi + wd * p[i]
        if mu != 0:
            buf = st["momentum_buffer"][i]
            buf = gi if buf is None else buf * mu + (1 - damp) * gi
            st["momentum_buffer"][i] = buf
            gi = gi + mu * buf if nest else buf
        p[i] = p[i] + (-lr) * gi


def mirror_adam(p, g, st, o, decoupled):
    lr, (b1, b2), eps, wd = o["lr"], o["betas"], o["eps"], o.get("weight_decay", 0.0)
    st["step"] += 1.0
    step = st["step"]
    for i in range(len(p)):
        gi = g[i]
        if wd != 0:
            if decoupled:
                p[i] = p[i] * (1 - lr * wd)
            else:
                gi = gi + wd * p[i]
        m = st["exp_avg"][i] = lerp(st["exp_avg"][i], gi, 1 - b1)
        v = st["exp_avg_sq"][i] = st["exp_avg_sq"][i] * b2 + ((1 - b2) * gi) * gi
        bc1 = 1 - b1 ** step
        bc2 = 1 - b2 ** step
        step_size = lr / bc1
        bc2_sqrt = bc2 ** 0.5
        denom = t_sqrt(v) / bc2_sqrt + eps
        p[i] = p[i] + ((-step_size) * m) / denom


def bits_equal(a, b):
    return all(x == y or (x != x and y != y) for x, y in zip(a, b)) and len(a) == len(b)


# ---- runs -----------------------------------------------------------------------------------
RUNS = [
    ("sgd", "SGD", dict(lr=0.05)),
    ("sgd_momentum", "SGD", dict(lr=0.05, momentum=0.9, dampening=0.1)),
    ("sgd_nesterov_wd", "SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", "Adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8)),
    ("adam_wd", "Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    ("adamw", "AdamW", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
    # AdamW(lr=0.02, weight_decay=0.1); betas and eps are AdamW's defaults, passed explicitly.
    ("adamw_schedule", "AdamW", dict(lr=0.02, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
]


def run_one(name, kind, options):
    params = [torch.tensor(v, requires_grad=True) for v in INIT]
    cls = getattr(torch.optim, kind)
    opt = cls(params, foreach=False, fused=False, **options)
    schedule = name == "adamw_schedule"
    # mirror state
    mp = list(INIT)
    mo = dict(options)
    if kind == "SGD":
        mst = {"momentum_buffer": [None] * len(mp)}
    else:
        mst = {"step": 0.0, "exp_avg": [0.0] * len(mp), "exp_avg_sq": [0.0] * len(mp)}
    losses, lrs = [], []
    for t in range(STEPS):
        if schedule:
            lr_t = 0.02 * 0.97 ** t
            for g in opt.param_groups:
                g["lr"] = lr_t
            lrs.append(lr_t)
            mo["lr"] = lr_t
        opt.zero_grad()
        loss = torch_loss(params)
        loss.backward()
        lv = loss.item()
        assert lv == mirror_loss(mp), (name, t, "loss")
        losses.append(lv)
        grads = [p.grad.item() for p in params]
        if name == "sgd" and t == 0:
            run_one.grad_init = grads
        opt.step()
        if kind == "SGD":
            mirror_sgd(mp, grads, mst, mo)
        else:
            mirror_adam(mp, grads, mst, mo, decoupled=(kind == "AdamW"))
        assert bits_equal([p.item() for p in params], mp), (name, t, "params")
    final = [p.item() for p in params]
    state = {}
    if kind == "SGD":
        if options.get("momentum", 0) != 0:
            state["momentum_buffer"] = [opt.state[p]["momentum_buffer"].item() for p in params]
            assert bits_equal(state["momentum_buffer"], mst["momentum_buffer"]), (name, "buf")
    else:
        state["exp_avg"] = [opt.state[p]["exp_avg"].item() for p in params]
        state["exp_avg_sq"] = [opt.state[p]["exp_avg_sq"].item() for p in params]
        steps = {opt.state[p]["step"].item() for p in params}
        assert len(steps) == 1
        state["step"] = int(steps.pop())
        assert state["step"] == STEPS and mst["step"] == float(STEPS)
        assert bits_equal(state["exp_avg"], mst["exp_avg"]), (name, "exp_avg")
        assert bits_equal(state["exp_avg_sq"], mst["exp_avg_sq"]), (name, "exp_avg_sq")
    opts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    run = {"name": name, "optimizer": kind, "options": opts}
    if schedule:
        run["lrs"] = lrs
    run.update({"losses": losses, "params": final, "state": state})
    for v in losses + final:
        assert math.isfinite(v)
    return run


def main():
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == "DEFAULT", cap
    runs = [run_one(*r) for r in RUNS]
    model = {
        "sizes": SIZES,
        "activation": "tanh",
        "init": INIT,
        "x": XS,
        "y": YS,
        "loss": "mean of squared errors, summed left to right then * 0.125",
        "grad_init": run_one.grad_init,
    }
    d = lambda v: json.dumps(v, separators=(",", ":"))
    out = ['{"torch_version":' + d(torch.__version__) + ","
           + '"cpu_capability":' + d(cap) + ",",
           '"model":' + d(model) + ",",
           '"runs":[']
    out += [d(r) + ("," if i + 1 < len(runs) else "") for i, r in enumerate(runs)]
    out.append("]}")
    text = "\n".join(out) + "\n"
    json.loads(text)
    sys.stdout.write(text)
    for r in runs:
        print(f"{r['name']:16s} loss[0]={r['losses'][0]!r} loss[99]={r['losses'][-1]!r}",
              file=sys.stderr)
    print("self-check: every step's loss, params and state equal the plain-float mirror bit "
          f"for bit; {COUNT}", file=sys.stderr)


if __name__ == "__main__":
    main()
